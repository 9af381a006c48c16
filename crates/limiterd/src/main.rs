//! The `limiterd` command: serve the API (the default; with envoy's gRPC protocol when
//! descriptor files are given), check a configuration or descriptor file, or print the
//! built-in configuration.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use limiterd::config::{BUILT_IN, Store};
use limiterd::envoy::Domains;
use limiterd::ops::files::{Sources, load_config, load_domains, read};

const AFTER_HELP: &str = "\
Examples:
  limiterd                                   serve the built-in policies in memory
  limiterd --config limiterd.toml            serve the policies in a file
  limiterd --redis redis://127.0.0.1:6379    share state with every limiterd on that Redis
  limiterd --redis cluster:redis://10.0.0.1:6379,redis://10.0.0.2:6379   on a Redis Cluster
  limiterd --redis sentinel:mymaster@redis://10.0.0.1:26379,redis://10.0.0.2:26379   via Sentinel
  limiterd --envoy ratelimit/web.yaml        also serve envoy's rate-limit gRPC protocol (127.0.0.1:8081)
  limiterd check-config limiterd.toml        check a file, with line numbers (or a descriptor .yaml)
  limiterd example-config                    print the built-in file, to start one from

Call it:
  curl -s -X POST http://127.0.0.1:8080/v1/ratelimit -d '{\"policy\":\"api\",\"identifier\":\"user-1\"}'";

/// A rate-limit service: named policies (token buckets, sliding and fixed windows, per
/// identifier or global, all or nothing) over HTTP, in memory or on Redis.
#[derive(Debug, Parser)]
#[command(name = "limiterd", version, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// The configuration file (TOML); without it, the built-in policies.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where to listen, overriding the file (port 0 picks a free port).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Keep state on this Redis, overriding where the file's store is: one server
    /// (redis://host:port, rediss:// for TLS), a cluster (cluster:URL,URL,...) or Sentinel
    /// (sentinel:MASTER@URL,URL,...). A password in a URL shows in the process list: give it
    /// in `[store]` (`password_file`, `password_env`) instead, with TLS files.
    #[arg(long, value_name = "WHERE")]
    redis: Option<String>,
    /// Each Redis call's timeout in milliseconds (1 to 60000; 25 by default), overriding the
    /// file's `timeout_ms`; a call past it follows the store's failure policy.
    #[arg(long, value_name = "MS")]
    redis_timeout_ms: Option<u64>,
    /// An envoy descriptor file (YAML, one domain) to serve over envoy's rate-limit gRPC
    /// protocol; repeat for more domains.
    #[arg(long = "envoy", value_name = "FILE")]
    envoy: Vec<PathBuf>,
    /// Where envoy's gRPC protocol listens, overriding the file (port 0 picks a free port).
    #[arg(long, value_name = "ADDR")]
    grpc_listen: Option<SocketAddr>,
    /// Where unkey's overrides are kept (JSON, written atomically on every change); by default
    /// `limiterd-overrides.json` beside --config, in memory only without one.
    #[arg(long, value_name = "FILE")]
    overrides: Option<PathBuf>,
    /// How much to log to stderr: error, warn, info, debug or trace (Redis outages and the
    /// failure policy at debug; the circuit breaker and a full key store at warn).
    #[arg(long, value_name = "LEVEL", default_value = "info")]
    log_level: tracing::Level,
    /// The log's format on stderr: one line of text per event, or one JSON object per line.
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    log: LogFormat,
    /// The same as `--log json`.
    #[arg(long, hide = true)]
    log_json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Checks a configuration file (TOML) or an envoy descriptor file (.yaml) and explains any
    /// error with its line.
    CheckConfig {
        /// The file.
        file: PathBuf,
    },
    /// Prints the built-in configuration.
    ExampleConfig,
}

fn is_yaml(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    )
}

fn check(file: &Path) -> Result<(), String> {
    if is_yaml(file) {
        let name = file.display().to_string();
        let domains =
            Domains::load([(name.as_str(), read(file)?.as_str())]).map_err(|e| e.to_string())?;
        for warning in domains.warnings() {
            eprintln!("warning: {warning}");
        }
        for domain in domains.iter() {
            println!(
                "{name}: valid; domain `{}`, {} limits",
                domain.name,
                domain.limits().count()
            );
        }
        return Ok(());
    }
    let config = load_config(file)?;
    let domains = load_domains(&config)?;
    for warning in domains.warnings() {
        eprintln!("warning: {warning}");
    }
    let envoy: Vec<_> = domains.iter().map(|d| d.name.clone()).collect();
    let count = config.policies.len();
    println!(
        "{}: valid; {count} {} ({}), store: {}{}",
        file.display(),
        if count == 1 { "policy" } else { "policies" },
        config
            .policies
            .keys()
            .cloned()
            .collect::<Vec<_>>()
            .join(", "),
        store_name(&config.store),
        if envoy.is_empty() {
            String::new()
        } else {
            format!("; envoy domains: {}", envoy.join(", "))
        }
    );
    // unkey's overrides kept beside the file (in memory; on Redis they live in Redis).
    let beside = file.with_file_name(limiterd::ops::files::OVERRIDES_FILE);
    if beside.exists() {
        // Read only: the limiterd that keeps them may be writing them now.
        let overrides = limiterd::ops::overrides::Overrides::read_only(&beside)?;
        let snapshot = overrides.snapshot();
        let count: usize = snapshot.values().map(Vec::len).sum();
        println!(
            "{}: {count} overrides in {} namespaces ({})",
            beside.display(),
            snapshot.len(),
            snapshot.keys().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Some(Command::CheckConfig { file }) => check(file),
        Some(Command::ExampleConfig) => {
            print!("{BUILT_IN}");
            Ok(())
        }
        None => {
            init_logs(cli.log_level, cli.log_json || cli.log == LogFormat::Json);
            run(&cli)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("limiterd: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr at `level` and above, as text or JSON lines; stdout keeps the banner.
fn init_logs(level: tracing::Level, json: bool) {
    let logs = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr);
    // Only `main` sets a subscriber, once: an error would mean one is already set.
    let _ = if json {
        logs.json().try_init()
    } else {
        logs.try_init()
    };
}

fn store_name(store: &Store) -> String {
    match store {
        Store::Memory { max_keys: None } => "memory".to_owned(),
        Store::Memory { max_keys: Some(n) } => format!("memory (at most {n} keys per policy)"),
        Store::Redis { connection, .. } => format!("redis ({})", connection.at),
    }
}

/// Prints a line of the banner to standard output, ignoring a closed stdout: a service keeps
/// serving when whoever started it stops reading its banner (`println!` would panic).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

fn run(cli: &Cli) -> Result<(), String> {
    let sources = Sources {
        config: cli.config.clone(),
        redis: cli.redis.clone(),
        redis_timeout_ms: cli.redis_timeout_ms,
        listen: cli.listen,
        envoy: cli.envoy.clone(),
        grpc_listen: cli.grpc_listen,
        reference_env: true,
        overrides: cli.overrides.clone(),
    };
    let (config, domains) = sources.load()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("no local address: {e}"))?;
        let grpc = match &config.envoy {
            Some(envoy) => Some(
                tokio::net::TcpListener::bind(envoy.listen)
                    .await
                    .map_err(|e| format!("cannot listen on {}: {e}", envoy.listen))?,
            ),
            None => None,
        };
        let policies: Vec<_> = config.policies.keys().cloned().collect();
        let first = policies.first().cloned().unwrap_or_default();
        say!("limiterd listening on http://{addr}");
        say!("store: {}; policies: {}", store_name(&config.store), policies.join(", "));
        say!(
            "try: curl -s -X POST http://{addr}/v1/ratelimit -d '{{\"policy\":\"{first}\",\"identifier\":\"user-1\"}}'"
        );
        if let Some(grpc) = &grpc {
            let grpc_addr = grpc
                .local_addr()
                .map_err(|e| format!("no local address: {e}"))?;
            let names: Vec<_> = domains.iter().map(|d| d.name.clone()).collect();
            say!("envoy rate-limit gRPC on {grpc_addr}; domains: {}", names.join(", "));
            say!("debug: curl -s -X POST http://{addr}/json -d '{{\"domain\":\"...\",\"descriptors\":[{{\"entries\":[{{\"key\":\"...\",\"value\":\"...\"}}]}}]}}'");
        }
        say!("status page: http://{addr}/ ; metrics: http://{addr}/metrics; health: /healthz, /readyz");
        say!(
            "reload: edit {} (checked every {} ms) or send SIGHUP; stop with Ctrl-C",
            cli.config.as_ref().map_or("the files".to_owned(), |p| p.display().to_string()),
            config.server.reload_check.as_millis()
        );
        tracing::info!(
            %addr,
            store = %store_name(&config.store),
            policies = policies.len(),
            envoy = grpc.is_some(),
            "limiterd serving"
        );
        let listeners = limiterd::Listeners {
            http: listener,
            grpc,
        };
        limiterd::serve(sources.clone(), config.clone(), domains, listeners, shutdown_signal()).await
    })?;
    tracing::info!("limiterd stopped");
    say!("limiterd stopped");
    Ok(())
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
