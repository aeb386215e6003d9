//! Egress end to end: real clients (curl, openssl) in a Debian sandbox with no network,
//! through PID 1's proxy and the link, to a TLS upstream on `127.0.0.1`.
//!
//! Loopback only: see [`super::egress_support`] for the test resolver and dialer.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use beige_core::GatewayBuilder;
use serde_json::json;

use super::egress_support::*;
use super::support::TestHome;
use crate::docker_or_skip;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_reaches_an_allowed_host_through_the_gateway_and_nothing_else() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let docker = t.docker().await;
    if !debian_image(&t).await {
        return;
    }
    let repo = bare_repo(t.dir.path());
    let upstream = tls_upstream(repo).await;
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    let resolver = TestResolver(HashMap::from([
        (API, Ok(vec![ip(PUBLIC_IP)])),
        (INJECT, Ok(vec![ip(PUBLIC_IP)])),
        ("internal.example.test", Ok(vec![ip("10.0.0.1")])),
        ("metadata.example.test", Ok(vec![ip("169.254.169.254")])),
        (
            "mixed.example.test",
            Ok(vec![ip(PUBLIC_IP), ip("10.0.0.1")]),
        ),
        ("mapped.example.test", Ok(vec![ip("::ffff:10.0.0.1")])),
        ("loop.example.test", Ok(vec![ip("127.0.0.1")])),
        ("broken.example.test", Err(())),
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
                    {"id": "api", "hosts": [API]},
                    {"id": "inject", "hosts": [INJECT]},
                    {"id": "trap", "hosts": [
                        "internal.example.test", "metadata.example.test",
                        "mixed.example.test", "mapped.example.test",
                        "loop.example.test", "broken.example.test"
                    ]},
                    {"id": "no-gist", "hosts": ["gist.example.test"], "action": "deny"},
                ], "credentials": ["tok"]},
            }),
        )],
    );
    // The credential, and the upstream's CA as an extra root of inspect mode.
    let roots = t.home.root().join("upstream-ca.pem");
    std::fs::write(&roots, &upstream.ca_pem).unwrap();
    config.egress = Some(
        serde_json::from_value(json!({
            "credentials": {"tok": {
                "secret": SECRET, "hosts": [INJECT],
                "inject": {"header": "Authorization", "format": "Bearer {}"},
            }},
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
    let ws = gw.config().agent_workspace(gw.home(), "net");
    std::fs::write(ws.join("ca.pem"), &upstream.ca_pem).unwrap();

    // The proxy environment is there for every exec.
    let envs = exec(&gw, "env | grep -i _proxy | sort").await;
    assert!(envs.contains("HTTPS_PROXY=http://127.0.0.1:3128"), "{envs}");
    assert!(envs.contains("NO_PROXY=localhost,127.0.0.1,::1"), "{envs}");
    // PID 1's DNS stub is the sandbox's only name server, without search domains.
    let resolv = exec(&gw, "cat /etc/resolv.conf").await;
    assert!(resolv.contains("nameserver 127.0.0.1"), "{resolv}");
    assert!(!resolv.contains("search"), "{resolv}");

    // 1. An allowed host: through the tunnel, the upstream saw the SNI.
    let ok = exec(
        &gw,
        &format!(
            "curl -sS --max-time 20 --cacert /workspace/ca.pem https://{API}/ ; echo \"rc=$?\""
        ),
    )
    .await;
    assert!(ok.contains("hello from the upstream"), "{ok}");
    assert!(ok.contains("rc=0"), "{ok}");
    assert_eq!(upstream.snis.lock().unwrap().as_slice(), [API]);

    // 1b. The same without the proxy: the name resolves to a synthetic loopback
    // address of PID 1's DNS stub, and the connection to it is carried transparently.
    let names = exec(
        &gw,
        &format!("getent hosts {API}; getent ahostsv6 {API}; echo \"rc=$?\""),
    )
    .await;
    assert!(
        names.contains(&format!("127.77.0.1      {API}")) || names.contains("127.77."),
        "{names}"
    );
    let transparent = exec(
        &gw,
        &format!("curl -sS --noproxy '*' --max-time 20 --cacert /workspace/ca.pem https://{API}/ ; echo \"rc=$?\""),
    )
    .await;
    assert!(
        transparent.contains("hello from the upstream"),
        "{transparent}"
    );
    assert_eq!(upstream.snis.lock().unwrap().as_slice(), [API, API]);

    // 1b'. Python's own HTTP client honours the proxy variables too.
    let py = exec(
        &gw,
        &format!(
            "python3 -c \"import ssl, urllib.request as u; print(u.urlopen('https://{API}/', context=ssl.create_default_context(cafile='/workspace/ca.pem'), timeout=20).read().decode())\" 2>&1"
        ),
    )
    .await;
    assert!(py.contains("hello from the upstream"), "{py}");

    // 1c. git clones over HTTPS through the proxy (dumb HTTP from the upstream).
    let cloned = exec(
        &gw,
        &format!(
            "cd /tmp && GIT_SSL_CAINFO=/workspace/ca.pem git clone -q https://{API}/repo.git r 2>&1; cat r/README; echo \"rc=$?\""
        ),
    )
    .await;
    assert!(cloned.contains("cloned through the gateway"), "{cloned}");
    // And fails readably for a host no rule allows.
    let refused_clone = exec(
        &gw,
        "cd /tmp && GIT_SSL_CAINFO=/workspace/ca.pem git clone -q https://code.example.test/repo.git s 2>&1; echo \"rc=$?\"",
    )
    .await;
    assert!(refused_clone.contains("403"), "{refused_clone}");
    assert!(!refused_clone.contains("rc=0"), "{refused_clone}");

    // 2. Refusals, each readable by a curl user.
    let refused = |host: &str, port: u16| {
        format!(
            "curl -sS -v --max-time 20 --cacert /workspace/ca.pem https://{host}:{port}/ 2>&1 | grep -i -e x-beige-egress -e 'HTTP/1.1 403' ; true"
        )
    };
    for (host, port, reason) in [
        ("unknown.example.test", 443, "no_rule"),
        ("gist.example.test", 443, "denied_by_rule"),
        (API, 8443, "port_not_allowed"),
        ("internal.example.test", 443, "private_address"),
        ("metadata.example.test", 443, "private_address"),
        ("mixed.example.test", 443, "private_address"),
        ("mapped.example.test", 443, "private_address"),
        ("loop.example.test", 443, "private_address"),
        ("broken.example.test", 443, "dns_failed"),
        (PUBLIC_IP, 443, "ip_literal"),
    ] {
        let out = exec(&gw, &refused(host, port)).await;
        assert!(out.contains("403"), "{host}:{port}: {out}");
        // The exec's result names the refusal for the model, once.
        let footer = format!("[beige] egress: 1 connection to {host}:{port} refused ({reason}: ");
        assert_eq!(out.matches(&footer).count(), 1, "{out}");
        assert!(
            out.to_ascii_lowercase()
                .contains(&format!("x-beige-egress: denied; reason={reason}")),
            "{host}:{port}: {out}"
        );
    }

    // 3. Domain fronting: a TLS client that names another server is cut off.
    let handshakes = upstream.snis.lock().unwrap().len();
    let fronted = exec(
        &gw,
        &format!(
            "echo | timeout 20 openssl s_client -proxy 127.0.0.1:3128 -connect {API}:443 -servername evil.example.test 2>&1 | head -5; true"
        ),
    )
    .await;
    assert!(!fronted.contains("Verify return code: 0"), "{fronted}");
    assert_eq!(
        upstream.snis.lock().unwrap().len(),
        handshakes,
        "the fronted hello must not reach the upstream"
    );

    // 3b. The agent cannot take PID 1's listeners.
    let binds = exec(
        &gw,
        r#"python3 -c '
import socket, errno
for kind, addr in [("tcp", ("127.0.0.1", 3128)), ("tcp", ("0.0.0.0", 443)), ("tcp", ("127.77.0.9", 80)), ("udp", ("127.0.0.1", 53))]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(addr); print(kind, addr, "bound")
    except OSError as e:
        print(kind, addr, errno.errorcode[e.errno])
'"#,
    )
    .await;
    assert_eq!(binds.matches("EADDRINUSE").count(), 4, "{binds}");

    // 4. No route out: a direct connect fails in the sandbox, with no packet sent.
    let direct = exec(
        &gw,
        "curl -sS --noproxy '*' --max-time 5 https://1.1.1.1/ 2>&1; echo \"rc=$?\"; ip route 2>/dev/null | wc -l",
    )
    .await;
    assert!(direct.contains("rc=7"), "{direct}");

    // 5. Inspect: the gateway injects the credential and masks it in the answer; the
    // client trusts the home's egress CA.
    let ca = std::fs::read_to_string(t.home.root().join("keys/egress-ca.pem")).unwrap();
    std::fs::write(ws.join("beige-ca.pem"), ca).unwrap();
    let injected = exec(
        &gw,
        &format!(
            "curl -sS --max-time 20 --cacert /workspace/beige-ca.pem -H 'Authorization: Bearer sk-fake' https://{INJECT}/v1/x https://{INJECT}/v1/y ; echo \"rc=$?\""
        ),
    )
    .await;
    assert!(injected.contains("rc=0"), "{injected}");
    assert!(!injected.contains(SECRET), "{injected}");
    assert_eq!(
        injected
            .matches(&format!(
                "authorization: Bearer {}",
                "*".repeat(SECRET.len())
            ))
            .count(),
        2,
        "{injected}"
    );
    let heads = upstream.heads.lock().unwrap().clone();
    let inject_heads: Vec<&String> = heads.iter().filter(|h| h.contains(INJECT)).collect();
    assert_eq!(inject_heads.len(), 2, "{heads:?}");
    for h in &inject_heads {
        assert!(
            h.contains(&format!("authorization: Bearer {SECRET}")),
            "{h}"
        );
        assert!(!h.contains("sk-fake"), "{h}");
    }

    // The dialer was only ever asked for the one allowed, public address.
    assert!(
        dialer.unexpected.lock().unwrap().is_empty(),
        "dialled: {:?}",
        dialer.unexpected.lock().unwrap()
    );

    // Audit: the allowed stream has `started` then `finished` with its bytes; every
    // refusal is one `finished`, `denied` record with its reason.
    let records = egress_records(&t);
    let api = records_for(&records, API, 443);
    let phases: Vec<&str> = api.iter().filter_map(|r| r["phase"].as_str()).collect();
    assert!(phases.starts_with(&["started", "finished"]), "{api:?}");
    let done = api[1];
    let transparent: Vec<_> = api
        .iter()
        .filter(|r| r["egress"]["entry"] == "transparent" && r["phase"] == "finished")
        .collect();
    assert_eq!(transparent.len(), 1, "{api:?}");
    assert_eq!(
        transparent[0]["decision"], "allowed",
        "{:?}",
        transparent[0]
    );
    assert_eq!(transparent[0]["egress"]["ip"], PUBLIC_IP);
    assert_eq!(done["decision"], "allowed", "{done}");
    assert_eq!(done["egress"]["ip"], PUBLIC_IP, "{done}");
    assert_eq!(done["egress"]["mode"], "tunnel", "{done}");
    assert_eq!(done["egress"]["entry"], "explicit", "{done}");
    assert_eq!(done["egress"]["rule"], "api", "{done}");
    assert!(done["egress"]["bytesUp"].as_u64().unwrap() > 0, "{done}");
    assert!(done["egress"]["bytesDown"].as_u64().unwrap() > 0, "{done}");
    for (host, reason) in [
        ("unknown.example.test", "no_rule"),
        ("gist.example.test", "denied_by_rule"),
        ("internal.example.test", "private_address"),
        ("metadata.example.test", "private_address"),
        ("broken.example.test", "dns_failed"),
    ] {
        let r = records_for(&records, host, 443);
        assert_eq!(r.len(), 1, "{host}: {r:?}");
        assert_eq!(r[0]["decision"], "denied", "{host}: {:?}", r[0]);
        assert_eq!(r[0]["egress"]["reason"], reason, "{host}: {:?}", r[0]);
    }
    let fronted: Vec<_> = api
        .iter()
        .filter(|r| r["egress"]["reason"] == "sni_mismatch")
        .collect();
    assert_eq!(fronted.len(), 1, "{api:?}");

    // Inspect: the connection record says so; one request record per request.
    let inject = records_for(&records, INJECT, 443);
    assert!(!inject.is_empty(), "{records:?}");
    for r in &inject {
        assert_eq!(r["egress"]["mode"], "inspect", "{r}");
    }
    // A request's record is written when its response ends, maybe after curl returned.
    let mut requests = request_records(&t);
    for _ in 0..100 {
        if requests.len() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        requests = request_records(&t);
    }
    assert_eq!(requests.len(), 2, "{requests:?}");
    for (r, path) in requests.iter().zip(["/v1/x", "/v1/y"]) {
        assert_eq!(r["egress"]["path"], path, "{r}");
        assert_eq!(r["egress"]["status"], 200, "{r}");
        assert_eq!(r["egress"]["substituted"], true, "{r}");
        assert_eq!(r["egress"]["scrubbed"], 1, "{r}");
    }
    let audit = std::fs::read_to_string(t.home.audit_log_path()).unwrap();
    assert!(!audit.contains(SECRET), "the secret is in the audit log");
    gw.shutdown().await.unwrap();
}
