//! OpenAI's `n` choices of one request streamed as one: each choice's outputs tagged with its
//! index, in the order they arrive, so the choices' chunks interleave as OpenAI's do.

use futures_util::StreamExt;
use futures_util::stream::{self, BoxStream};
use tokio::sync::mpsc::{self, Receiver};
use tracing::Instrument;

use crate::server::generation::Output;

/// One receiver of every choice's outputs, each with its choice's index (its position in
/// `choices`), ending once every choice has ended. Dropping it drops every choice's receiver
/// at once, which cancels them.
pub fn interleave(choices: Vec<Receiver<Output>>) -> Receiver<(usize, Output)> {
    let (tx, rx) = mpsc::channel(64);
    let tagged: Vec<BoxStream<'static, (usize, Output)>> = choices
        .into_iter()
        .enumerate()
        .map(|(index, outputs)| {
            stream::unfold(outputs, move |mut outputs| async move {
                let output = outputs.recv().await?;
                Some(((index, output), outputs))
            })
            .boxed()
        })
        .collect();
    let mut all = stream::select_all(tagged);
    tokio::spawn(
        async move {
            loop {
                let next = tokio::select! {
                    next = all.next() => next,
                    // The client left: stop waiting for the next output.
                    () = tx.closed() => None,
                };
                let Some(item) = next else { break };
                if tx.send(item).await.is_err() {
                    break;
                }
            }
        }
        .in_current_span(),
    );
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tags_each_output_with_its_choice_and_keeps_each_choice_in_order() {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..3).map(|_| mpsc::channel(8)).unzip();
        let mut merged = interleave(receivers);
        for (choice, tx) in senders.iter().enumerate() {
            for piece in 0..2 {
                let text = format!("{choice}.{piece}");
                tx.send(Output::Content(text, Vec::new())).await.unwrap();
            }
        }
        drop(senders);
        let mut seen: Vec<Vec<String>> = vec![Vec::new(); 3];
        while let Some((choice, output)) = merged.recv().await {
            let Output::Content(text, _) = output else {
                panic!("{output:?}")
            };
            seen[choice].push(text);
        }
        for (choice, texts) in seen.iter().enumerate() {
            assert_eq!(texts, &[format!("{choice}.0"), format!("{choice}.1")]);
        }
    }

    #[tokio::test]
    async fn dropping_the_merged_receiver_closes_every_choice() {
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..2).map(|_| mpsc::channel::<Output>(8)).unzip();
        let merged = interleave(receivers);
        drop(merged);
        for tx in &senders {
            tokio::time::timeout(std::time::Duration::from_secs(5), tx.closed())
                .await
                .unwrap();
        }
    }
}
