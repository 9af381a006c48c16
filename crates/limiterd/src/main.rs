//! The `limiterd` command: serve the API (the default), check a configuration file, or print
//! the built-in one.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use limiterd::config::{BUILT_IN, Config, Store};

const AFTER_HELP: &str = "\
Examples:
  limiterd                                   serve the built-in policies in memory
  limiterd --config limiterd.toml            serve the policies in a file
  limiterd --redis redis://127.0.0.1:6379    share state with every limiterd on that Redis
  limiterd check-config limiterd.toml        check a file, with line numbers
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
    /// Keep state on this Redis (redis://host:port), overriding the file's store.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Checks a configuration file and explains any error with its line.
    CheckConfig {
        /// The file.
        file: PathBuf,
    },
    /// Prints the built-in configuration.
    ExampleConfig,
}

fn load(path: &PathBuf) -> Result<Config, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read it: {e}", path.display()))?;
    Config::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Some(Command::CheckConfig { file }) => load(file).map(|config| {
            println!(
                "{}: valid; {} policies ({}), store: {}",
                file.display(),
                config.policies.len(),
                config
                    .policies
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
                store_name(&config.store)
            );
        }),
        Some(Command::ExampleConfig) => {
            print!("{BUILT_IN}");
            Ok(())
        }
        None => run(&cli),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("limiterd: {message}");
            ExitCode::FAILURE
        }
    }
}

fn store_name(store: &Store) -> String {
    match store {
        Store::Memory { max_keys: None } => "memory".to_owned(),
        Store::Memory { max_keys: Some(n) } => format!("memory (at most {n} keys per policy)"),
        Store::Redis { url, .. } => format!("redis ({url})"),
    }
}

fn run(cli: &Cli) -> Result<(), String> {
    let mut config = match &cli.config {
        Some(path) => load(path)?,
        None => Config::parse(BUILT_IN).map_err(|e| format!("the built-in configuration: {e}"))?,
    };
    if let Some(url) = &cli.redis {
        config = config.with_redis(url).map_err(|e| e.to_string())?;
    }
    if let Some(listen) = cli.listen {
        config.listen = listen;
    }
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
        let policies: Vec<_> = config.policies.keys().cloned().collect();
        let first = policies.first().cloned().unwrap_or_default();
        println!("limiterd listening on http://{addr}");
        println!("store: {}; policies: {}", store_name(&config.store), policies.join(", "));
        println!(
            "try: curl -s -X POST http://{addr}/v1/ratelimit -d '{{\"policy\":\"{first}\",\"identifier\":\"user-1\"}}'"
        );
        println!("metrics: http://{addr}/metrics; stop with Ctrl-C");
        limiterd::serve(&config, listener, shutdown_signal()).await
    })?;
    println!("limiterd stopped");
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
