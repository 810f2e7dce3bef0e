//! `podsim`: read and validate flags (exit 64 listing every bad one), register adapters, bind
//! every pod (`--pods`), print `podsim listening on http://ADDR` for each, serve until SIGTERM
//! or Ctrl-C, drain, exit.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use podsim::cli::{vllm_env_flag, Args};
use podsim::server::fleet::{start_fleet, stop_fleet};

fn main() -> ExitCode {
    let args = Args::parse();
    let env_flag = |name: &str| vllm_env_flag(std::env::var(name).ok().as_deref());
    let allow = env_flag("VLLM_ALLOW_RUNTIME_LORA_UPDATING");
    let mut problems = Vec::new();
    let addrs = args.listen_addrs().map_err(|p| problems.push(p)).ok();
    let config = args
        .server_config(allow)
        .map_err(|p| problems.extend(p))
        .ok();
    let config = config.map(|mut c| {
        c.dev_mode = env_flag("VLLM_SERVER_DEV_MODE");
        c
    });
    let (Some(addrs), Some(config)) = (addrs, config) else {
        for p in problems {
            eprintln!("podsim: {p}");
        }
        return ExitCode::from(64);
    };
    // As on vLLM, a template that does not compile does not stop the server: chat requests
    // get a 400 naming the error.
    for (name, error) in config.chat_template.compile_errors() {
        eprintln!(
            "podsim: chat template {name} ({}) does not compile; chat requests will get 400: {error}",
            config.chat_template.origin()
        );
    }
    let modules = args.lora_modules().unwrap_or_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("podsim: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let servers = match start_fleet(&config, &modules, &addrs).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("podsim: {e}");
                return ExitCode::from(64);
            }
        };
        // Printed once every pod is bound: a reader that has N lines has N pods serving.
        for server in &servers {
            println!("podsim listening on http://{}", server.addr);
        }
        wait_for_signal().await;
        eprintln!("podsim: shutting down");
        stop_fleet(
            servers,
            Duration::from_secs_f64(args.shutdown_grace_seconds),
        )
        .await;
        ExitCode::SUCCESS
    })
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
