use super::*;

#[test]
fn span_and_attribute_names_are_pinned() {
    insta::assert_snapshot!(names::ALL.join("\n"));
}

#[test]
fn without_export_spans_are_no_ops_and_bind_nothing() {
    let traces = Arc::new(Traces::off());
    let cx = traces.root("invoke_agent a".into(), vec![]);
    assert!(!cx.span().span_context().is_valid());
    assert!(traces.bind_exec("e1", &cx).is_none());
    assert!(!traces
        .exec_context(Some("e1"))
        .span()
        .span_context()
        .is_valid());
    assert!(traces.prompt_attribute("hello").is_none());
}

#[test]
fn captured_text_is_redacted_and_cut() {
    let traces = Traces {
        capture_prompts: true,
        secrets: vec!["sk-secret-0123456789".into()],
        ..Traces::off()
    };
    let long = format!("use sk-secret-0123456789 {}", "é".repeat(3000));
    let s = traces.captured(&long);
    assert!(s.starts_with("use *** "), "{}", &s[..20]);
    assert!(s.len() <= CAPTURE_LIMIT);
    assert!(!s.contains("sk-secret"));
}
