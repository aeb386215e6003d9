//! The tool-client role: the built binary runs through a symlink named `kv` (as
//! `/tools/bin/kv` in a sandbox) against a fake gateway — a Unix listener in a thread that
//! records the request line and answers a canned reply.

use std::ffi::OsStr;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use beige_protocol::socket::MAX_STDIN_BYTES;
use serde_json::{json, Value};

/// Longest any single client run may take before the test calls it a hang.
const HANG: Duration = Duration::from_secs(10);

/// What the fake gateway does after accepting a connection.
enum Answer {
    /// Reads the request line, writes this line plus `\n`.
    Line(String),
    /// Reads the request line, then closes without answering.
    CloseAfterReading,
    /// Closes the connection without reading anything.
    CloseAtOnce,
    /// Reads the request line and then says nothing for this long.
    Silent(Duration),
}

fn reply(value: Value) -> Answer {
    Answer::Line(value.to_string())
}

/// A temporary directory with the `kv` link, a workspace and (maybe) a fake gateway.
struct Sandbox {
    dir: tempfile::TempDir,
    requests: Option<mpsc::Receiver<String>>,
}

impl Sandbox {
    /// Without a gateway: the socket path does not exist.
    fn without_gateway() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_beige-shim"), dir.path().join("kv"))
            .unwrap();
        fs::create_dir_all(dir.path().join("ws/projects/x")).unwrap();
        Self {
            dir,
            requests: None,
        }
    }

    /// With a gateway that serves one connection as `answer` says.
    fn with_gateway(answer: Answer) -> Self {
        let mut sandbox = Self::without_gateway();
        let listener = UnixListener::bind(sandbox.socket()).unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || serve_one(&listener, answer, &tx));
        sandbox.requests = Some(rx);
        sandbox
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn socket(&self) -> PathBuf {
        self.root().join("gw.sock")
    }

    fn kv(&self) -> PathBuf {
        self.root().join("kv")
    }

    /// The workspace, canonical (the shim compares it with the kernel's cwd).
    fn workspace(&self) -> PathBuf {
        fs::canonicalize(self.root().join("ws")).unwrap()
    }

    /// A command with a clean environment: only PATH, the socket and the workspace.
    fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(program);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("BEIGE_SOCKET", self.socket())
            .env("BEIGE_WORKSPACE", self.workspace())
            .current_dir(self.root())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn kv_command(&self, args: &[&str]) -> Command {
        let mut cmd = self.command(self.kv());
        cmd.args(args);
        cmd
    }

    /// The request line the gateway received.
    fn request(&self) -> Value {
        let line = self
            .requests
            .as_ref()
            .expect("no gateway")
            .recv_timeout(HANG)
            .expect("the gateway received no request");
        serde_json::from_str(&line).unwrap()
    }

    /// Whether the gateway received a request (waiting briefly).
    fn received_nothing(&self) -> bool {
        match &self.requests {
            None => true,
            Some(rx) => rx.recv_timeout(Duration::from_millis(300)).is_err(),
        }
    }
}

fn serve_one(listener: &UnixListener, answer: Answer, requests: &mpsc::Sender<String>) {
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => return,
        }
    };
    stream.set_nonblocking(false).unwrap();
    if let Answer::CloseAtOnce = answer {
        return;
    }
    stream.set_read_timeout(Some(HANG)).unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let _ = requests.send(line.trim_end_matches('\n').to_owned());
    let mut stream = reader.into_inner();
    match answer {
        Answer::Line(text) => {
            let _ = stream.write_all(format!("{text}\n").as_bytes());
        }
        Answer::Silent(pause) => std::thread::sleep(pause),
        Answer::CloseAfterReading | Answer::CloseAtOnce => {}
    }
}

/// Waits for `child` at most [`HANG`]; kills it and fails the test if it hangs.
fn finish(child: Child) -> Output {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(HANG) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("the tool client hung for more than {HANG:?}");
        }
    }
}

fn run(cmd: &mut Command) -> Output {
    finish(cmd.spawn().unwrap())
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn decoded_stdin(request: &Value) -> Option<Vec<u8>> {
    request.get("stdin").map(|s| {
        base64::engine::general_purpose::STANDARD
            .decode(s.as_str().unwrap())
            .unwrap()
    })
}

#[test]
fn request_line_shape_and_success_output() {
    let sb = Sandbox::with_gateway(reply(
        json!({"type":"tool_response","success":true,"output":"v","exitCode":0}),
    ));
    let out = run(sb
        .kv_command(&["get", "user:7", "--help"])
        .current_dir(sb.workspace().join("projects/x"))
        .env("BEIGE_SESSION_KEY", "telegram:42")
        .env("BEIGE_CHANNEL", "telegram")
        .env("BEIGE_CHAT_ID", "42")
        .env("BEIGE_THREAD_ID", ""));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(stdout(&out), "v", "no newline is added");
    assert_eq!(stderr(&out), "");
    assert_eq!(
        sb.request(),
        json!({
            "type": "tool_request",
            "tool": "kv",
            "args": ["get", "user:7", "--help"],
            "cwd": "projects/x",
            "sessionContext": {"sessionKey": "telegram:42", "channel": "telegram", "chatId": "42"}
        })
    );
}

#[test]
fn full_session_context_is_forwarded() {
    let sb = Sandbox::with_gateway(reply(
        json!({"type":"tool_response","success":true,"exitCode":0}),
    ));
    let out = run(sb
        .kv_command(&["list"])
        .env("BEIGE_SESSION_KEY", "s")
        .env("BEIGE_CHANNEL", "c")
        .env("BEIGE_AGENT_NAME", "a")
        .env("BEIGE_CHAT_ID", "1")
        .env("BEIGE_THREAD_ID", "2"));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(stdout(&out), "");
    assert_eq!(
        sb.request()["sessionContext"],
        json!({"sessionKey":"s","channel":"c","agentName":"a","chatId":"1","threadId":"2"})
    );
}

#[test]
fn cwd_and_context_are_omitted_when_not_applicable() {
    let ok = || reply(json!({"type":"tool_response","success":true,"output":"","exitCode":0}));
    // At the workspace root; a channel without a session key sends no context.
    let sb = Sandbox::with_gateway(ok());
    let out = run(sb
        .kv_command(&["get", "k"])
        .current_dir(sb.workspace())
        .env("BEIGE_CHANNEL", "telegram"));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(
        sb.request(),
        json!({"type":"tool_request","tool":"kv","args":["get","k"]})
    );
    // Outside the workspace.
    let sb = Sandbox::with_gateway(ok());
    let out = run(sb.kv_command(&[]).current_dir(sb.root()));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(
        sb.request(),
        json!({"type":"tool_request","tool":"kv","args":[]})
    );
}

#[test]
fn failure_maps_error_to_stderr_and_exit_code() {
    let sb = Sandbox::with_gateway(reply(
        json!({"type":"tool_response","success":false,"output":"ignored","error":"boom","exitCode":3}),
    ));
    let out = run(&mut sb.kv_command(&["get", "x"]));
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(stdout(&out), "");
    assert_eq!(stderr(&out), "boom\n");

    // Exit code 0 or absent on a failure becomes 1; a message that already ends with a
    // newline gets none added.
    let sb = Sandbox::with_gateway(reply(
        json!({"type":"tool_response","success":false,"error":"Permission denied\n","exitCode":0}),
    ));
    let out = run(&mut sb.kv_command(&["get", "x"]));
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out), "Permission denied\n");

    // Without `error`, the output is the message.
    let sb = Sandbox::with_gateway(reply(
        json!({"type":"tool_response","success":false,"output":"not found"}),
    ));
    let out = run(&mut sb.kv_command(&["get", "x"]));
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out), "");
    assert_eq!(stderr(&out), "not found\n");
}

#[test]
fn success_with_a_nonzero_code_keeps_it() {
    let sb = Sandbox::with_gateway(reply(
        json!({"type":"tool_response","success":true,"output":"partial\n","exitCode":5}),
    ));
    let out = run(&mut sb.kv_command(&["get", "x"]));
    assert_eq!(out.status.code(), Some(5));
    assert_eq!(stdout(&out), "partial\n");
}

#[test]
fn stdin_from_a_pipe_is_forwarded() {
    let sb = Sandbox::with_gateway(reply(
        json!({"type":"tool_response","success":true,"output":"OK\n","exitCode":0}),
    ));
    let out = run(sb
        .command("sh")
        .args(["-c", r#"echo data | "$KV" set k"#])
        .env("KV", sb.kv()));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(stdout(&out), "OK\n");
    let request = sb.request();
    assert_eq!(request["args"], json!(["set", "k"]));
    assert_eq!(decoded_stdin(&request).as_deref(), Some(&b"data\n"[..]));
}

#[test]
fn stdin_from_a_regular_file_is_forwarded() {
    let sb = Sandbox::with_gateway(reply(
        json!({"type":"tool_response","success":true,"exitCode":0}),
    ));
    let file = sb.root().join("input.bin");
    let content: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    fs::write(&file, &content).unwrap();
    let out = run(sb
        .kv_command(&["set", "k"])
        .stdin(fs::File::open(&file).unwrap()));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(decoded_stdin(&sb.request()), Some(content));
}

#[test]
fn dev_null_and_an_empty_pipe_send_no_stdin() {
    let ok = || reply(json!({"type":"tool_response","success":true,"exitCode":0}));
    let sb = Sandbox::with_gateway(ok());
    let out = run(sb.kv_command(&["get", "k"]).stdin(Stdio::null()));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(sb.request().get("stdin"), None);

    // A pipe whose writer closed without writing: readable (end of file), but empty.
    let sb = Sandbox::with_gateway(ok());
    let out = run(sb
        .command("sh")
        .args(["-c", r#"true | "$KV" get k"#])
        .env("KV", sb.kv()));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(sb.request().get("stdin"), None);
}

#[test]
fn an_idle_pipe_does_not_hang() {
    let sb = Sandbox::with_gateway(reply(
        json!({"type":"tool_response","success":true,"output":"v","exitCode":0}),
    ));
    let started = Instant::now();
    let mut child = sb
        .kv_command(&["get", "k"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    // Keep the write end open and never write to it.
    let writer = child.stdin.take().unwrap();
    let out = finish(child);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(writer);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(stdout(&out), "v");
    assert_eq!(sb.request().get("stdin"), None);
}

#[test]
fn slow_producers_need_beige_tool_stdin() {
    let ok = || reply(json!({"type":"tool_response","success":true,"exitCode":0}));
    let script = r#"(sleep 0.5; echo late) | "$KV" set k"#;
    // The rule: a pipe that stays idle for 50 ms is not read.
    let sb = Sandbox::with_gateway(ok());
    let out = run(sb.command("sh").args(["-c", script]).env("KV", sb.kv()));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(sb.request().get("stdin"), None);
    // BEIGE_TOOL_STDIN=1 waits for end of file.
    let sb = Sandbox::with_gateway(ok());
    let out = run(sb
        .command("sh")
        .args(["-c", script])
        .env("KV", sb.kv())
        .env("BEIGE_TOOL_STDIN", "1"));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(
        decoded_stdin(&sb.request()).as_deref(),
        Some(&b"late\n"[..])
    );
    // BEIGE_TOOL_STDIN=0 never reads, even a ready pipe.
    let sb = Sandbox::with_gateway(ok());
    let out = run(sb
        .command("sh")
        .args(["-c", r#"echo data | "$KV" set k"#])
        .env("KV", sb.kv())
        .env("BEIGE_TOOL_STDIN", "0"));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(sb.request().get("stdin"), None);
    // Anything else is refused.
    let sb = Sandbox::without_gateway();
    let out = run(sb.kv_command(&["get", "k"]).env("BEIGE_TOOL_STDIN", "yes"));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("BEIGE_TOOL_STDIN"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn too_much_stdin_is_refused_before_connecting() {
    let sb = Sandbox::with_gateway(reply(
        json!({"type":"tool_response","success":true,"exitCode":0}),
    ));
    let file = sb.root().join("big");
    let f = fs::File::create(&file).unwrap();
    f.set_len(u64::try_from(MAX_STDIN_BYTES).unwrap() + 1)
        .unwrap();
    drop(f);
    let out = run(sb
        .kv_command(&["set", "k"])
        .stdin(fs::File::open(&file).unwrap()));
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.starts_with("kv: stdin is larger than"), "{err}");
    assert!(err.contains(&MAX_STDIN_BYTES.to_string()), "{err}");
    assert!(sb.received_nothing());

    // Exactly the limit is fine.
    let sb = Sandbox::with_gateway(reply(
        json!({"type":"tool_response","success":true,"exitCode":0}),
    ));
    let file = sb.root().join("max");
    let f = fs::File::create(&file).unwrap();
    f.set_len(u64::try_from(MAX_STDIN_BYTES).unwrap()).unwrap();
    drop(f);
    let out = run(sb
        .kv_command(&["set", "k"])
        .stdin(fs::File::open(&file).unwrap()));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(
        decoded_stdin(&sb.request()).map(|d| d.len()),
        Some(MAX_STDIN_BYTES)
    );
}

#[test]
fn missing_socket_exits_125_with_a_clear_message() {
    let sb = Sandbox::without_gateway();
    let out = run(&mut sb.kv_command(&["get", "k"]));
    assert_eq!(out.status.code(), Some(125));
    let err = stderr(&out);
    let expected = format!(
        "kv: cannot reach the beige gateway at {}: ",
        sb.socket().display()
    );
    assert!(err.starts_with(&expected), "{err}");
    assert!(err.contains("No such file or directory"), "{err}");
    assert!(
        err.trim_end()
            .ends_with("The gateway may be restarting; try again in a moment."),
        "{err}"
    );
    assert_eq!(stdout(&out), "");
}

#[test]
fn refused_connection_exits_125() {
    let sb = Sandbox::without_gateway();
    // A socket file nobody listens on any more.
    drop(UnixListener::bind(sb.socket()).unwrap());
    let out = run(&mut sb.kv_command(&["get", "k"]));
    assert_eq!(out.status.code(), Some(125));
    assert!(
        stderr(&out).contains("Connection refused"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn garbage_reply_exits_126_and_shows_it_truncated() {
    let sb = Sandbox::with_gateway(Answer::Line(format!("hello {}", "x".repeat(1000))));
    let out = run(&mut sb.kv_command(&["get", "k"]));
    assert_eq!(out.status.code(), Some(126));
    let err = stderr(&out);
    assert!(
        err.starts_with("kv: the beige gateway's reply is not a tool response"),
        "{err}"
    );
    assert!(err.contains("\"hello xxx"), "{err}");
    assert!(err.len() < 500, "{err}");
    assert_eq!(stdout(&out), "");

    let sb = Sandbox::with_gateway(reply(json!({"type":"tool_request","tool":"kv"})));
    let out = run(&mut sb.kv_command(&["get", "k"]));
    assert_eq!(out.status.code(), Some(126));
    assert!(stderr(&out).contains("tool_request"), "{}", stderr(&out));
}

#[test]
fn closing_without_a_reply_exits_126() {
    let sb = Sandbox::with_gateway(Answer::CloseAfterReading);
    let out = run(&mut sb.kv_command(&["get", "k"]));
    assert_eq!(out.status.code(), Some(126));
    assert!(
        stderr(&out).contains("closed the connection without replying"),
        "{}",
        stderr(&out)
    );

    let sb = Sandbox::with_gateway(Answer::CloseAtOnce);
    let out = run(&mut sb.kv_command(&["get", "k"]));
    assert_eq!(out.status.code(), Some(126), "stderr: {}", stderr(&out));
    assert!(
        stderr(&out).contains("closed the connection"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_explicit_tool_role_sends_the_same_request() {
    let ok = || reply(json!({"type":"tool_response","success":true,"output":"1","exitCode":0}));
    let via_link = Sandbox::with_gateway(ok());
    let out = run(via_link
        .kv_command(&["get", "x"])
        .current_dir(via_link.workspace().join("projects"))
        .env("BEIGE_SESSION_KEY", "k"));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let linked = via_link.request();

    let explicit = Sandbox::with_gateway(ok());
    let out = run(explicit
        .command(env!("CARGO_BIN_EXE_beige-shim"))
        .args(["tool", "kv", "get", "x"])
        .current_dir(explicit.workspace().join("projects"))
        .env("BEIGE_SESSION_KEY", "k"));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert_eq!(stdout(&out), "1");
    assert_eq!(explicit.request(), linked);
    assert_eq!(linked["cwd"], json!("projects"));
}

#[test]
fn non_utf8_arguments_are_refused() {
    let sb = Sandbox::with_gateway(reply(
        json!({"type":"tool_response","success":true,"exitCode":0}),
    ));
    let out = run(sb.kv_command(&["set"]).arg(OsStr::from_bytes(b"caf\xe9")));
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.starts_with("kv: argument 2 "), "{err}");
    assert!(err.contains("UTF-8"), "{err}");
    assert!(sb.received_nothing());
}

#[test]
fn client_timeout_exits_124() {
    let sb = Sandbox::with_gateway(Answer::Silent(Duration::from_secs(5)));
    let started = Instant::now();
    let out = run(sb
        .kv_command(&["get", "k"])
        .env("BEIGE_TOOL_TIMEOUT", "0.3"));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(out.status.code(), Some(124));
    assert!(stderr(&out).contains("within 0.3 s"), "{}", stderr(&out));

    let sb = Sandbox::without_gateway();
    let out = run(sb
        .kv_command(&["get", "k"])
        .env("BEIGE_TOOL_TIMEOUT", "soon"));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("BEIGE_TOOL_TIMEOUT"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn closed_stdout_is_not_an_error() {
    let sb = Sandbox::with_gateway(reply(
        json!({"type":"tool_response","success":true,"output":"x".repeat(200_000),"exitCode":0}),
    ));
    let mut child = sb.kv_command(&["list"]).spawn().unwrap();
    drop(child.stdout.take());
    let out = finish(child);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stderr(&out), "");
}
