//! A store failure as an operator meets it: a key on Redis holding what limiterd did not
//! write, under `on_failure = "open"`, admits the call without counting it, and the log names
//! the key, at most one line every ten seconds (with how many were left out), where before
//! only a counter moved.

use limiter_testkit::redis_server::RedisServer;
use redis::Commands;

use crate::support::{Daemon, temp_file};
use serde_json::json;

#[tokio::test]
async fn a_key_limiterd_did_not_write_is_named_in_a_paced_warning_when_the_policy_fails_open() {
    let redis = RedisServer::start();
    let file = temp_file(
        &format!("fail-open-{}.toml", redis.port),
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\non_failure = \"open\"\n\
             [policies.api]\nlimits = [{{ algorithm = \"token_bucket\", count = 5, period = \"1h\" }}]\n",
            redis.url()
        ),
    );
    let daemon = Daemon::start_recorded(&["--config", file.to_str().expect("UTF-8")], &[]);
    let mut client = crate::support::Client::connect(daemon.addr).await;
    let ask = json!({"policy": "api", "identifier": "spoilt"});
    let first = client.decide(ask.clone()).await;
    assert_eq!(first["source"], "redis", "{first}");
    let mut conn = redis.client();
    let keys: Vec<String> = conn.keys("limiterd:*spoilt*").expect("KEYS");
    let [key] = keys.as_slice() else {
        panic!("one key for the identifier: {keys:?}");
    };
    let _: () = conn.set(key, "not a state").expect("SET");
    for _ in 0..3 {
        let answer = client.decide(ask.clone()).await;
        assert_eq!(
            (answer["success"].clone(), answer["source"].clone()),
            (json!(true), json!("fail_open")),
            "{answer}"
        );
    }
    let output = daemon.wait_for_output(key.as_str());
    let warnings: Vec<&str> = output
        .lines()
        .filter(|line| line.contains("a store call failed"))
        .collect();
    assert_eq!(warnings.len(), 1, "paced, not one a call:\n{output}");
    assert!(warnings[0].contains(key.as_str()), "{output}");
    let held: String = conn.get(key).expect("GET");
    assert_eq!(held, "not a state", "left as found");
}
