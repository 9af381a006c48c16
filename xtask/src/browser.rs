//! `cargo xtask browser`: limiterd's status page in a real headless browser (Chromium, Debian's
//! `chromium` package; `CHROMIUM` names another binary). It builds and starts limiterd on a
//! free loopback port, then checks, each time from the DOM Chromium leaves after the page's
//! script ran:
//!
//! 1. the page loads, shows readiness and lists every built-in policy, with nothing denied;
//! 2. after traffic (a client over its limit), the totals and the top denied identifier show it;
//! 3. while traffic flows, the page refreshes itself and shows live rates;
//! 4. an override set over unkey's v2 API is listed.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::daemon::start_limiterd;

/// The key the page's limiterd accepts (for setting an override).
const ROOT_KEY: &str = "xtask-browser-root-key";

/// One `POST /v1/ratelimit` over its own connection; the status line.
fn decide(addr: SocketAddr, policy: &str, identifier: &str) -> Result<String, String> {
    let body = format!(r#"{{"policy":"{policy}","identifier":"{identifier}"}}"#);
    post(addr, "/v1/ratelimit", &body)
}

/// One keyed `POST` over its own connection; the status line.
fn post(addr: SocketAddr, path: &str, body: &str) -> Result<String, String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\nauthorization: Bearer {ROOT_KEY}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    let mut reply = String::new();
    stream
        .read_to_string(&mut reply)
        .map_err(|e| format!("read: {e}"))?;
    Ok(reply.lines().next().unwrap_or_default().to_owned())
}

fn chromium() -> String {
    std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into())
}

/// The DOM of `url` after `budget_ms` of the page's (virtual) time.
fn dump_dom(url: &str, budget_ms: u32) -> Result<String, String> {
    let profile = std::env::temp_dir().join(format!("xtask-chromium-{}", std::process::id()));
    let output = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            &format!("--user-data-dir={}", profile.display()),
            &format!("--virtual-time-budget={budget_ms}"),
            "--dump-dom",
            url,
        ])
        .stderr(Stdio::null())
        .output()
        .map_err(|e| {
            format!(
                "cannot run {} ({e}): install Debian's `chromium` package, or set CHROMIUM",
                chromium()
            )
        })?;
    let _ = std::fs::remove_dir_all(&profile);
    if !output.status.success() {
        return Err(format!(
            "{} --dump-dom failed ({})",
            chromium(),
            output.status
        ));
    }
    String::from_utf8(output.stdout).map_err(|e| format!("the DOM is not UTF-8: {e}"))
}

/// The cells of the policy row `name` in the dumped DOM.
fn policy_row(dom: &str, name: &str) -> Option<Vec<String>> {
    let start = dom.find(&format!("data-policy=\"{name}\""))?;
    let row = &dom[start..];
    let row = &row[..row.find("</tr>")?];
    Some(
        row.split("<td")
            .skip(1)
            .filter_map(|cell| {
                let text = cell.split_once('>')?.1;
                Some(text.split("</td>").next()?.to_owned())
            })
            .collect(),
    )
}

fn check(ok: bool, what: &str, dom: &str) -> Result<(), String> {
    if ok {
        println!("xtask browser: ok: {what}");
        Ok(())
    } else {
        Err(format!(
            "the status page does not show {what}; its DOM:\n{dom}"
        ))
    }
}

/// The task.
pub(crate) fn run() -> Result<(), String> {
    crate::daemon::build_limiterd()?;
    let daemon = start_limiterd(&[("LIMITERD_ROOT_KEY", ROOT_KEY)], &[])?;
    let url = format!("http://{}/", daemon.addr);

    // 1. It loads, is ready, and lists the policies, nothing denied.
    let dom = dump_dom(&url, 1_500)?;
    check(
        dom.contains("<title>limiterd status</title>"),
        "its title",
        &dom,
    )?;
    check(
        dom.contains(r#"id="ready" class="ok">ready<"#),
        "readiness (ready)",
        &dom,
    )?;
    for policy in ["api", "global", "login"] {
        check(
            policy_row(&dom, policy).is_some(),
            &format!("the `{policy}` policy"),
            &dom,
        )?;
    }
    let login = policy_row(&dom, "login").unwrap_or_default();
    check(
        login.get(4).map(String::as_str) == Some("0"),
        "no denials yet",
        &dom,
    )?;

    // 2. 5 logins per minute: 8 attempts by one client, 1 by another.
    for _ in 0..8 {
        decide(daemon.addr, "login", "mallory")?;
    }
    let status = decide(daemon.addr, "login", "alice")?;
    if !status.contains("200") {
        return Err(format!("limiterd answered {status:?}"));
    }
    let dom = dump_dom(&url, 1_500)?;
    let login = policy_row(&dom, "login").unwrap_or_default();
    check(
        login.get(3).map(String::as_str) == Some("6")
            && login.get(4).map(String::as_str) == Some("3"),
        "6 allowed and 3 denied for `login`",
        &dom,
    )?;
    check(
        dom.contains("<td>mallory</td><td class=\"n\">3</td>"),
        "mallory as the top denied identifier, 3 denials",
        &dom,
    )?;

    // 3. Traffic while the page is open: it refreshes itself and shows rates.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let stop = Arc::clone(&stop);
        let addr = daemon.addr;
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = decide(addr, "api", &format!("user-{}", n % 50));
                n += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            n
        })
    };
    let dom = dump_dom(&url, 4_000);
    stop.store(true, Ordering::Relaxed);
    let sent = traffic.join().map_err(|_| "the traffic thread panicked")?;
    let dom = dom?;
    let updates: u64 = dom
        .split("data-updates=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    check(updates >= 2, &format!("refreshes (saw {updates})"), &dom)?;
    let api = policy_row(&dom, "api").unwrap_or_default();
    let rate = api.get(1).cloned().unwrap_or_default();
    check(
        rate.parse::<f64>().is_ok(),
        &format!("a live rate for `api` (saw {rate:?}, {sent} requests sent)"),
        &dom,
    )?;

    // 4. An override set over unkey's v2 API is listed.
    let set = r#"{"namespace":"api","identifier":"team_*","limit":7,"duration":60000}"#;
    let status = post(daemon.addr, "/v2/ratelimit.setOverride", set)?;
    if !status.contains("200") {
        return Err(format!("setOverride answered {status:?}"));
    }
    let dom = dump_dom(&url, 1_500)?;
    check(
        dom.contains(
            r#"data-override="api/team_*"><td>api</td><td>team_*</td><td class="n">7</td>"#,
        ),
        "the override of `team_*`",
        &dom,
    )?;
    println!(
        "xtask browser: the status page loads, lists the policies and overrides, and follows traffic"
    );
    Ok(())
}
