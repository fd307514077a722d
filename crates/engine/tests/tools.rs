//! Tool calling through real chat templates (`corelm_engine::tools`).

mod common;

/// Tools through Qwen2.5's own template (the Hermes format): the tools as `tojson` writes them
/// in Python (`", "` and `": "`, keys in order), an earlier call in `<tool_call>` tags and its
/// result in `<tool_response>`; a forced call's prompt ends inside the tag.
#[test]
fn tools_through_a_hermes_template() {
    use corelm_engine::chat::{ChatTemplate, Message};
    use corelm_engine::tools::{self, Answer, Choice, Format, Tool};
    let g = corelm_gguf::Gguf::open(common::model_path("qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf")).unwrap();
    let tok = corelm_engine::Tokenizer::from_gguf(&g).unwrap();
    let t = ChatTemplate::from_gguf(&g, &tok).unwrap();
    assert_eq!(t.tool_format(), Format::Hermes);
    let tool = Tool::from_openai(
        &serde_json::json!({"type": "function", "function": {"name": "get_weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}),
        "tools[0]",
    )
    .unwrap();
    let mut asked = Message::new("assistant", "");
    asked.tool_calls = Some(vec![serde_json::json!({"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}})]);
    let mut result = Message::new("tool", "12 C");
    result.tool_call_id = Some("c1".into());
    let msgs = [Message::new("user", "Weather in Oslo?"), asked, result];
    let (text, answer, forced) = tools::prompt(&t, &msgs, std::slice::from_ref(&tool), &Choice::Required, true, &Default::default()).unwrap();
    for want in [
        "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather now\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>",
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call><|im_end|>",
        "<|im_start|>user\n<tool_response>\n12 C\n</tool_response><|im_end|>",
    ] {
        assert!(text.contains(want), "{want}\nnot in\n{text}");
    }
    assert!(text.ends_with("<|im_start|>assistant\n<tool_call>\n"), "{text}");
    assert_eq!(answer, Answer::Bare);
    assert!(matches!(forced, Some(corelm_engine::constraint::Constraint::Json(_))));
    // `auto`: a lazy constraint, free again after a call only with parallel calls.
    for parallel in [true, false] {
        let (_, answer, held) = tools::prompt(&t, &msgs[..1], std::slice::from_ref(&tool), &Choice::Auto, parallel, &Default::default()).unwrap();
        assert_eq!(answer, Answer::Free(Format::Hermes));
        match held {
            Some(corelm_engine::constraint::Constraint::Lazy(l)) => assert_eq!(l.again, parallel),
            h => panic!("{h:?}"),
        }
    }
    // Without tools the template renders as before.
    assert_eq!(t.render(&msgs[..1], true).unwrap(), t.render_with_tools(&msgs[..1], &[], true).unwrap());
    assert!(!t.render(&msgs[..1], true).unwrap().contains("<tools>"));
}
