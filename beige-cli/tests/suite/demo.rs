//! `beige demo`: the offline demonstration with the scripted model, in a real sandbox.

use super::TestEnv;
use crate::docker_or_skip;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_runs_offline_with_the_labelled_scripted_model() {
    let _docker = docker_or_skip!();
    let env = TestEnv::new();
    let run = tokio::task::block_in_place(|| env.run(&["demo"]));
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let out = &run.stdout;
    assert!(
        out.contains("model: scripted (deterministic demo model, not an LLM)"),
        "{out}"
    );
    assert!(out.contains("assistant (scripted model) ▸"), "{out}");
    assert!(out.contains("user ▸ Use the kv tool"), "{out}");
    assert!(out.contains("  → exec sh /workspace/kv-demo.sh"), "{out}");
    assert!(out.contains("sum=5525"), "{out}");
    assert!(out.contains("add up to 5525"), "{out}");
    assert!(
        out.contains("1 model round trip with tools · 1 write · 1 exec · 50 kv calls"),
        "{out}"
    );
    assert!(out.contains("104 audit records"), "{out}");
    assert!(
        out.contains("and 1 prompt record, each naming who sent it"),
        "{out}"
    );
    assert!(out.contains("0 denied"), "{out}");
    assert!(out.contains("sandbox start"), "{out}");
    assert!(out.contains("the exec with 50 kv calls"), "{out}");
    assert!(out.contains("total"), "{out}");
    assert!(!env.home().exists(), "the demo must not touch BEIGE_HOME");
}

#[test]
fn demo_without_docker_says_how_to_get_it() {
    let env = TestEnv::new().with_var("DOCKER_HOST", "unix:///nonexistent/docker.sock");
    let run = env.run(&["demo"]);
    if run.stderr.contains("shim") {
        eprintln!(
            "SKIPPED: no static shim, so the demo stops before Docker: {}",
            run.stderr
        );
        return;
    }
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("Docker is not usable"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("scripts/setup-docker"),
        "{}",
        run.stderr
    );
}
