//! The four core tools in a real container, through `Gateway::call_tool` — the same
//! suite over each way an op reaches the sandbox: the shim link on its Unix carrier,
//! the link on the attach carrier (forced locally), and `docker exec` (link off). Every
//! result is checked to have taken the transport under test.

use base64::Engine as _;
use beige_core::api::tools::{ContentBlock, CoreToolCall, ToolContext, ToolOutput};
use beige_core::config::LinkMode;
use beige_core::sandbox::Transport;
use beige_core::{Gateway, LocalGateway};
use serde_json::json;

use super::support::TestHome;
use crate::docker_or_skip;

tokio::task_local! {
    /// The carrier under test.
    static LINK: LinkMode;
}

fn expected_transport() -> Transport {
    match LINK.get() {
        LinkMode::Unix => Transport::LINK_UNIX,
        LinkMode::Attach => Transport::LINK_ATTACH,
        LinkMode::Off => Transport::DOCKER_EXEC,
    }
}

fn checked(out: ToolOutput) -> ToolOutput {
    assert_eq!(
        out.transport,
        Some(expected_transport()),
        "the op took the wrong transport: {out:?}"
    );
    out
}

async fn exec(gw: &LocalGateway, agent: &str, command: &str) -> ToolOutput {
    checked(super::sandbox_docker::exec(gw, agent, command).await)
}

async fn call(gw: &LocalGateway, tool: &str, params: serde_json::Value) -> ToolOutput {
    call_ctx(gw, tool, params, ToolContext::default()).await
}

async fn call_ctx(
    gw: &LocalGateway,
    tool: &str,
    params: serde_json::Value,
    ctx: ToolContext,
) -> ToolOutput {
    let call = CoreToolCall::parse(tool, params).unwrap();
    checked(gw.call_tool("tools", call, ctx).await.unwrap())
}

async fn start(t: &TestHome, env: &super::support::DockerEnv) -> LocalGateway {
    let link = LINK.get().as_str();
    t.gateway(
        env,
        t.config(env, &[("tools", json!({"sandbox": {"link": link}}))]),
    )
    .await
}

/// Runs each named test once per carrier.
macro_rules! on_every_carrier {
    ($($name:ident),* $(,)?) => {
        mod over_unix_link {
            $(#[tokio::test]
            async fn $name() {
                super::LINK.scope(super::LinkMode::Unix, super::$name()).await
            })*
        }
        mod over_attach_link {
            $(#[tokio::test]
            async fn $name() {
                super::LINK.scope(super::LinkMode::Attach, super::$name()).await
            })*
        }
        mod over_docker_exec {
            $(#[tokio::test]
            async fn $name() {
                super::LINK.scope(super::LinkMode::Off, super::$name()).await
            })*
        }
    };
}

on_every_carrier!(
    write_read_round_trip_all_byte_values,
    hostile_paths_create_exactly_that_file_and_run_nothing,
    patch_requires_exactly_one_match_and_keeps_mode,
    read_offset_limit_and_errors,
    images_with_and_without_vision,
    exec_exit_codes_flood_cap_and_timeout,
    a_capped_output_is_kept_whole_where_the_result_says,
);

async fn write_read_round_trip_all_byte_values() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = start(&t, &env).await;
    let content: String = (0u32..=0xFF)
        .filter_map(char::from_u32)
        .collect::<String>()
        .repeat(3);
    let out = call(
        &gw,
        "write",
        json!({"path": "bin/all.txt", "content": content}),
    )
    .await;
    assert_eq!(
        out.joined_text(),
        format!("Successfully wrote {} bytes to bin/all.txt", content.len())
    );
    let out = call(&gw, "read", json!({"path": "bin/all.txt"})).await;
    assert!(!out.is_error);
    assert_eq!(
        out.content,
        vec![ContentBlock::Text {
            text: content.clone()
        }]
    );
    // Exactly those bytes on the host too.
    let host = std::fs::read(t.home.default_workspace("tools").join("bin/all.txt")).unwrap();
    assert_eq!(host, content.as_bytes());
    gw.shutdown().await.unwrap();
}

async fn hostile_paths_create_exactly_that_file_and_run_nothing() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = start(&t, &env).await;
    let names = [
        "it's.txt",
        "say \"hi\".txt",
        "$(touch /tmp/pwned).txt",
        "`touch /tmp/pwned2`.txt",
        "with space.txt",
        "new\nline.txt",
        "ünïcödé.txt",
    ];
    for name in names {
        let out = call(
            &gw,
            "write",
            json!({"path": format!("odd/{name}"), "content": name}),
        )
        .await;
        assert!(!out.is_error, "{name}: {}", out.joined_text());
        let out = call(&gw, "read", json!({"path": format!("odd/{name}")})).await;
        assert_eq!(out.joined_text(), name);
        let out = call(
            &gw,
            "patch",
            json!({"path": format!("odd/{name}"), "oldText": name, "newText": "patched"}),
        )
        .await;
        assert!(!out.is_error, "{name}: {}", out.joined_text());
    }
    // Each path exists on the host exactly as named (a `/` inside a name is a folder).
    let ws = t.home.default_workspace("tools").join("odd");
    for name in names {
        let content = std::fs::read_to_string(ws.join(name)).unwrap();
        assert_eq!(content, "patched", "{name}");
    }
    assert!(ws.join("$(touch ").is_dir());
    assert!(!std::path::Path::new("/tmp/pwned").exists());
    let out = exec(&gw, "tools", "ls /tmp/pwned /tmp/pwned2 2>&1; true").await;
    assert!(
        out.joined_text().contains("No such file"),
        "{}",
        out.joined_text()
    );
    gw.shutdown().await.unwrap();
}

async fn patch_requires_exactly_one_match_and_keeps_mode() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = start(&t, &env).await;
    call(
        &gw,
        "write",
        json!({"path": "p.sh", "content": "echo one\necho two\necho two\n"}),
    )
    .await;
    exec(&gw, "tools", "chmod 750 p.sh").await;

    let none = call(
        &gw,
        "patch",
        json!({"path": "p.sh", "oldText": "echo three", "newText": "x"}),
    )
    .await;
    assert!(none.is_error);
    assert!(
        none.joined_text().contains("not found"),
        "{}",
        none.joined_text()
    );

    let two = call(
        &gw,
        "patch",
        json!({"path": "p.sh", "oldText": "echo two", "newText": "x"}),
    )
    .await;
    assert!(two.is_error);
    assert!(
        two.joined_text().contains("2 times"),
        "{}",
        two.joined_text()
    );

    let one = call(
        &gw,
        "patch",
        json!({"path": "p.sh", "oldText": "echo one", "newText": "echo $& 1"}),
    )
    .await;
    assert_eq!(one.joined_text(), "Successfully patched p.sh");
    let read = call(&gw, "read", json!({"path": "p.sh"})).await;
    assert_eq!(read.joined_text(), "echo $& 1\necho two\necho two\n");
    let mode = exec(&gw, "tools", "stat -c %a p.sh").await;
    assert_eq!(mode.joined_text(), "Exit code: 0\n750");
    gw.shutdown().await.unwrap();
}

async fn read_offset_limit_and_errors() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = start(&t, &env).await;
    let lines: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    call(&gw, "write", json!({"path": "ten.txt", "content": lines})).await;
    let out = call(
        &gw,
        "read",
        json!({"path": "ten.txt", "offset": 3, "limit": 2}),
    )
    .await;
    assert_eq!(out.joined_text(), "line 3\nline 4\n");
    let out = call(
        &gw,
        "read",
        json!({"path": "ten.txt", "offset": 0, "limit": 1}),
    )
    .await;
    assert_eq!(out.joined_text(), "line 1\n");
    let out = call(
        &gw,
        "read",
        json!({"path": "/workspace/ten.txt", "offset": 9}),
    )
    .await;
    assert_eq!(out.joined_text(), "line 9\nline 10\n");

    let missing = call(&gw, "read", json!({"path": "nope.txt"})).await;
    assert!(missing.is_error);
    assert!(
        missing.joined_text().contains("not found"),
        "{}",
        missing.joined_text()
    );
    exec(&gw, "tools", "mkdir -p adir").await;
    let dir = call(&gw, "read", json!({"path": "adir"})).await;
    assert!(dir.is_error);
    assert!(
        dir.joined_text().contains("directory"),
        "{}",
        dir.joined_text()
    );

    // A file larger than the 256 KiB cap says how to read the rest.
    exec(&gw, "tools", "i=0; while [ $i -lt 40000 ]; do echo \"row $i of a long file\"; i=$((i+1)); done > big.txt").await;
    let big = call(&gw, "read", json!({"path": "big.txt"})).await;
    let text = big.joined_text();
    assert!(text.len() < 270 * 1024, "{}", text.len());
    assert!(text.contains("of 40000"), "{}", &text[text.len() - 300..]);
    assert!(text.contains("\"offset\""));
    gw.shutdown().await.unwrap();
}

async fn images_with_and_without_vision() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = start(&t, &env).await;
    // A PNG signature plus non-UTF-8 bytes, written by the sandbox itself.
    exec(
        &gw,
        "tools",
        "printf '\\211PNG\\r\\n\\032\\n\\000\\377\\376' > pic.png; cp pic.png blob.bin",
    )
    .await;
    let expected = b"\x89PNG\r\n\x1a\n\x00\xff\xfe";

    let vision = ToolContext {
        model: Some("anthropic/claude-sonnet-4-6".into()),
        model_accepts_images: true,
        ..Default::default()
    };
    let out = call_ctx(&gw, "read", json!({"path": "pic.png"}), vision).await;
    match &out.content[..] {
        [ContentBlock::Image { data, mime_type }] => {
            assert_eq!(mime_type, "image/png");
            assert_eq!(
                base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .unwrap(),
                expected
            );
        }
        other => panic!("expected an image, got {other:?}"),
    }

    let blind = ToolContext {
        model: Some("ollama/llama3.1:8b".into()),
        model_accepts_images: false,
        ..Default::default()
    };
    let out = call_ctx(&gw, "read", json!({"path": "pic.png"}), blind).await;
    assert!(out.is_error);
    assert!(
        out.joined_text().contains("ollama/llama3.1:8b"),
        "{}",
        out.joined_text()
    );

    let out = call(&gw, "read", json!({"path": "blob.bin"})).await;
    assert!(
        out.joined_text().starts_with("binary file, 11 bytes"),
        "{}",
        out.joined_text()
    );
    gw.shutdown().await.unwrap();
}

/// The path a capped result names, checked to be an output file in the workspace.
fn output_file_named_in(text: &str) -> String {
    let start = text.find("/workspace/.beige/out/").unwrap_or_else(|| {
        panic!(
            "no output file named in: {}",
            &text[text.len().saturating_sub(600)..]
        )
    });
    let end = start + text[start..].find(".log").expect("a .log path") + 4;
    text[start..end].to_string()
}

async fn a_capped_output_is_kept_whole_where_the_result_says() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = start(&t, &env).await;

    // 1,288,895 bytes of numbered lines, and a line on stderr in the middle: far over
    // the 64 KiB cap.
    let out = exec(
        &gw,
        "tools",
        "seq 1 100000; sleep 0.3; echo middle >&2; sleep 0.3; seq 100001 200000",
    )
    .await;
    let text = out.joined_text();
    assert!(text.len() < 80 * 1024, "{}", text.len());
    assert!(text.contains("bytes omitted"), "{}", &text[..200]);
    assert!(
        text.contains("all of it (1288902 bytes, stdout and stderr as they came)"),
        "{}",
        &text[text.len() - 600..]
    );
    let path = output_file_named_in(&text);

    // The model reads on through the path, with `read`'s offset and limit...
    let part = call(
        &gw,
        "read",
        json!({"path": path, "offset": 150001, "limit": 3}),
    )
    .await;
    assert!(!part.is_error, "{}", part.joined_text());
    assert_eq!(part.joined_text(), "150000\n150001\n150002\n");
    let middle = call(
        &gw,
        "read",
        json!({"path": path, "offset": 100001, "limit": 2}),
    )
    .await;
    assert_eq!(middle.joined_text(), "middle\n100001\n");
    // ...and the whole file is exactly the output, in the order it came.
    let same = exec(
        &gw,
        "tools",
        &format!("(seq 1 100000; echo middle; seq 100001 200000) | cmp - {path} && echo same"),
    )
    .await;
    assert_eq!(same.joined_text(), "Exit code: 0\nsame");
    // It belongs to the agent (the user its commands run as), mode 0600, in its
    // workspace.
    let owner = exec(&gw, "tools", &format!("stat -c '%u %a' {path}; id -u")).await;
    let text = owner.joined_text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    let uid = lines[2];
    assert_eq!(lines[1], format!("{uid} 600"), "{text}");

    // Output within the cap leaves no file behind.
    let before = exec(&gw, "tools", "ls .beige/out | wc -l")
        .await
        .joined_text();
    let small = exec(&gw, "tools", "echo small").await;
    assert_eq!(small.joined_text(), "Exit code: 0\nsmall");
    let after = exec(&gw, "tools", "ls .beige/out | wc -l")
        .await
        .joined_text();
    assert_eq!(before, after);
    gw.shutdown().await.unwrap();
}

async fn exec_exit_codes_flood_cap_and_timeout() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = start(&t, &env).await;

    let out = exec(&gw, "tools", "echo out; echo err >&2; exit 3").await;
    assert_eq!(out.joined_text(), "Exit code: 3\nout\nerr");
    assert!(out.is_error);
    let out = exec(&gw, "tools", "pwd; echo $BEIGE_AGENT_NAME").await;
    assert_eq!(out.joined_text(), "Exit code: 0\n/workspace\ntools");

    // 50 MB of output: capped to about 64 KiB with a marker.
    let out = exec(
        &gw,
        "tools",
        "head -c 50000000 /dev/zero | tr '\\0' a; echo; echo done",
    )
    .await;
    let text = out.joined_text();
    assert!(text.len() < 80 * 1024, "{}", text.len());
    assert!(text.starts_with("Exit code: 0\naaaa"));
    assert!(text.contains("omitted"), "{}", &text[..200]);
    assert!(
        text.contains("\ndone\n[beige] The output was cut to the exec output limit; all of it (50000006 bytes"),
        "{}",
        &text[text.len().saturating_sub(600)..]
    );

    // A timeout kills the whole process group: no `sleep` survives.
    let out = gw
        .call_tool(
            "tools",
            CoreToolCall::parse(
                "exec",
                json!({"command": "sleep 100 & sleep 100; wait", "timeout": 2}),
            )
            .unwrap(),
            ToolContext::default(),
        )
        .await
        .unwrap();
    assert!(out.is_error);
    assert!(
        out.joined_text().contains("timed out after 2 s"),
        "{}",
        out.joined_text()
    );
    let left = exec(
        &gw,
        "tools",
        "for p in /proc/[0-9]*; do tr '\\0' ' ' 2>/dev/null < $p/cmdline; echo; done | grep -c '^sleep' || true",
    )
    .await;
    assert_eq!(left.joined_text(), "Exit code: 0\n0");
    gw.shutdown().await.unwrap();
}
