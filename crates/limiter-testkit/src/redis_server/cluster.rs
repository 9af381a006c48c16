//! A Redis Cluster of three masters started by a test: with or without a replica each, with
//! `cluster-require-full-coverage` as asked, and over TLS (feature `tls-certs`) when asked.

use super::{RedisServer, free_port, raw_command, wait_until};

/// How to start a cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Replicas per master (0 or more).
    pub replicas: usize,
    /// `cluster-require-full-coverage`: whether the whole cluster refuses commands while a
    /// slot has no master (Redis's default, yes).
    pub full_coverage: bool,
    /// `cluster-node-timeout` in ms: how long before a silent node is failed (and a replica
    /// promoted).
    pub node_timeout_ms: u64,
    /// TLS on every node (clients, the cluster bus, replication), on these certificates.
    #[cfg(feature = "tls-certs")]
    pub tls: Option<super::tls::TestCerts>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            replicas: 0,
            full_coverage: true,
            node_timeout_ms: 2_000,
            #[cfg(feature = "tls-certs")]
            tls: None,
        }
    }
}

/// A Redis Cluster: three masters, each slot range on its own process, and their replicas.
#[derive(Debug)]
pub struct RedisCluster {
    /// The three masters as started, in slot order.
    pub nodes: Vec<RedisServer>,
    /// Each master's replicas, in the masters' order (`replicas[i]` replicate `nodes[i]`).
    pub replicas: Vec<Vec<RedisServer>>,
    tls: bool,
}

fn ok(reply: Option<String>) {
    assert!(
        reply.as_deref().is_some_and(|r| r.starts_with("+OK")),
        "{reply:?}"
    );
}

impl RedisCluster {
    /// Three masters without replicas, each with a third of the slots; waits for
    /// `cluster_state:ok`.
    pub fn start() -> Self {
        Self::start_with(&ClusterOptions::default())
    }

    /// A cluster as `options` say; waits for `cluster_state:ok` and every replica in sync.
    pub fn start_with(options: &ClusterOptions) -> Self {
        let masters: Vec<(RedisServer, u16)> = (0..3).map(|_| start_node(options)).collect();
        let replicas: Vec<Vec<(RedisServer, u16)>> = (0..3)
            .map(|_| (0..options.replicas).map(|_| start_node(options)).collect())
            .collect();
        let tls = masters[0].0.tls_port.is_some();
        let client_port = |server: &RedisServer| server.tls_port.unwrap_or(server.port);
        // Each master takes a third of the 16384 slots, then every node meets the first.
        let thirds = [(0, 5460), (5461, 10922), (10923, 16383)];
        for ((node, _), (first, last)) in masters.iter().zip(thirds) {
            ok(raw_command(
                node.port,
                &format!("CLUSTER ADDSLOTSRANGE {first} {last}"),
            ));
        }
        let first = masters[0].0.port;
        for (node, bus) in masters[1..].iter().chain(replicas.iter().flatten()) {
            ok(raw_command(
                first,
                &format!("CLUSTER MEET 127.0.0.1 {} {bus}", client_port(node)),
            ));
        }
        let masters: Vec<RedisServer> = masters.into_iter().map(|(node, _)| node).collect();
        let replicas: Vec<Vec<RedisServer>> = replicas
            .into_iter()
            .map(|list| list.into_iter().map(|(node, _)| node).collect())
            .collect();
        wait_until_formed(&masters, &replicas);
        Self {
            nodes: masters,
            replicas,
            tls,
        }
    }

    /// Every master's URL, the seed list a cluster client takes (`rediss://` at `localhost`
    /// on a TLS cluster).
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|node| {
                if self.tls {
                    node.tls_url("localhost")
                } else {
                    node.url()
                }
            })
            .collect()
    }

    /// The index of the master that started with `key`'s slot (by the slots
    /// [`start`](Self::start) gave each, the slot as the cluster itself computes it).
    pub fn master_of(&self, key: &str) -> usize {
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.nodes[0].client())
            .expect("CLUSTER KEYSLOT");
        match slot {
            0..=5460 => 0,
            5461..=10922 => 1,
            _ => 2,
        }
    }

    /// Waits until a node other than `dead` answers `CLUSTER INFO` with `state` (`ok` or
    /// `fail`).
    pub fn wait_for_state(&self, dead: usize, state: &str) {
        let alive = self.nodes[(dead + 1) % self.nodes.len()].port;
        let wanted = format!("cluster_state:{state}");
        wait_until("the cluster's state", || {
            raw_command(alive, "CLUSTER INFO").is_some_and(|r| r.contains(&wanted))
        });
    }

    /// Waits until master `index`'s replicas have every write it has acknowledged (their
    /// replication offsets equal its own): a failover then loses nothing.
    pub fn wait_for_replication(&self, index: usize) {
        for replica in &self.replicas[index] {
            super::wait_until_replicated(self.nodes[index].port, replica.port);
        }
    }

    /// How many script calls (`FCALL`, `EVALSHA`, `EVAL`) each master has run since its stats
    /// were last reset.
    pub fn script_calls(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .map(|node| {
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query(&mut node.client())
                    .expect("INFO commandstats");
                ["fcall", "evalsha", "eval"]
                    .iter()
                    .map(|command| super::calls_in(&info, command))
                    .sum::<u64>()
            })
            .collect()
    }
}

/// A node's cluster id.
fn node_id(port: u16) -> String {
    let reply = raw_command(port, "CLUSTER MYID").expect("CLUSTER MYID");
    // `$40\r\n<id>\r\n`
    reply.lines().nth(1).expect("an id").trim().to_owned()
}

/// One cluster node as `options` say (TLS on the client, bus and replication links when they
/// give certificates), and its cluster bus port.
fn start_node(options: &ClusterOptions) -> (RedisServer, u16) {
    let bus = free_port();
    let args = vec![
        "--cluster-enabled".to_owned(),
        "yes".to_owned(),
        "--cluster-node-timeout".to_owned(),
        options.node_timeout_ms.to_string(),
        "--cluster-port".to_owned(),
        bus.to_string(),
        "--cluster-require-full-coverage".to_owned(),
        if options.full_coverage { "yes" } else { "no" }.to_owned(),
    ];
    #[cfg(feature = "tls-certs")]
    if let Some(certs) = &options.tls {
        let mut args = args;
        args.extend(certs.server_args(false));
        args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(str::to_owned));
        return (
            RedisServer::start_on(free_port(), Some(free_port()), args),
            bus,
        );
    }
    (RedisServer::start_with(args), bus)
}

/// Waits until every node of `masters` and `replicas` (by master) knows every other, each
/// replica follows its master, the cluster is ok on every node and every replica is in sync.
fn wait_until_formed(masters: &[RedisServer], replicas: &[Vec<RedisServer>]) {
    let everyone = || masters.iter().chain(replicas.iter().flatten());
    let total = everyone().count();
    for node in everyone() {
        let port = node.port;
        wait_until("every node to know every other", || {
            raw_command(port, "CLUSTER INFO")
                .is_some_and(|r| r.contains(&format!("cluster_known_nodes:{total}")))
        });
    }
    for (master, replicas) in masters.iter().zip(replicas) {
        let id = node_id(master.port);
        for replica in replicas {
            let port = replica.port;
            wait_until("a replica to take its master", || {
                raw_command(port, &format!("CLUSTER REPLICATE {id}"))
                    .is_some_and(|r| r.starts_with("+OK"))
            });
        }
    }
    for node in everyone() {
        let port = node.port;
        wait_until("the cluster to be ok", || {
            raw_command(port, "CLUSTER INFO").is_some_and(|r| r.contains("cluster_state:ok"))
        });
    }
    for replica in replicas.iter().flatten() {
        let port = replica.port;
        wait_until("a replica to be in sync", || {
            raw_command(port, "INFO replication")
                .is_some_and(|r| r.contains("master_link_status:up"))
        });
    }
}
