//! Greedy speculative decoding by prompt lookup: the n-gram drafter proposes what followed the
//! last tokens earlier in the context, one (simulated) target forward checks the whole draft,
//! and every round commits the accepted run plus one token of the target's own.
//!
//! ```sh
//! cargo run --example prompt_lookup   # from speculate
//! ```
//!
//! The target is a stand-in that knows its greedy output in advance: more records of a JSON
//! list, whose keys and punctuation repeat what the prompt holds. Only its argmax rows are
//! needed, so nothing here touches a tensor library. The output is exactly what plain greedy
//! decoding gives; what changes is how many forwards it takes.
//!
//! The draft depth is fixed here. An engine asks a `DepthController` for each round's depth
//! and reports the round back (`observe`), so that drafting backs off where it does not pay.

use speculate::{NgramDrafter, SequenceDrafter, verify_greedy};

/// The most tokens drafted per round.
const DEPTH: usize = 6;

/// The output, one word per token: JSON records, one per line, then the end of sequence.
const TEXT: &str = r#"
{ "id" : 1 , "name" : "ann" , "role" : "dev" , "active" : true } \n
{ "id" : 2 , "name" : "bob" , "role" : "dev" , "active" : true } \n
{ "id" : 3 , "name" : "cy" , "role" : "dev" , "active" : true } \n
{ "id" : 4 , "name" : "dee" , "role" : "dev" , "active" : true } \n
{ "id" : 5 , "name" : "eve" , "role" : "dev" , "active" : true } \n <eos>"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A toy vocabulary: token id `i` is `words[i]`.
    let mut words: Vec<&str> = Vec::new();
    let tokens: Vec<u32> = TEXT
        .split_whitespace()
        .map(|word| {
            let id = words.iter().position(|&w| w == word).unwrap_or_else(|| {
                words.push(word);
                words.len() - 1
            });
            id as u32
        })
        .collect();
    let decode = |ids: &[u32]| -> String {
        let text: Vec<&str> = ids.iter().map(|&id| words[id as usize]).collect();
        text.join(" ")
    };
    // The prompt holds two records and the start of the third; the rest is the answer.
    let (prompt, answer) = tokens.split_at(2 * 18 + 1);
    println!("prompt: {}", decode(prompt));

    let mut drafter = NgramDrafter::default();
    drafter.settle(prompt);

    let mut output: Vec<u32> = Vec::new();
    let mut forwards = 0;
    while output.len() < answer.len() {
        let draft = drafter.propose(DEPTH);

        // One forward over the last committed token plus the draft gives draft.len() + 1
        // argmax rows: the target's choice after each prefix of the draft.
        let argmax: Vec<u32> = (0..=draft.len())
            .map(|i| {
                answer
                    .get(output.len() + i)
                    .copied()
                    .unwrap_or(answer[answer.len() - 1])
            })
            .collect();
        forwards += 1;
        let verdict = verify_greedy(&draft.tokens, &argmax)?;

        // The accepted run plus the target's own next token are committed.
        let mut committed = draft.tokens[..verdict.accepted].to_vec();
        committed.push(verdict.next);
        println!(
            "round {forwards:2}: drafted {:<30} accepted {} → {}",
            format!("[{}]", decode(&draft.tokens)),
            verdict.accepted,
            decode(&committed)
        );
        drafter.commit(&committed);
        output.extend(&committed);
    }
    output.truncate(answer.len());

    assert_eq!(output, answer, "speculation must not change greedy output");
    println!(
        "{} tokens in {forwards} forwards ({:.2} per forward), same text as plain greedy decoding",
        output.len(),
        output.len() as f64 / f64::from(forwards)
    );
    Ok(())
}
