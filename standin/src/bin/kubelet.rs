//! `kubelet` STAND-IN (not Kubernetes): see the hawser-standin crate.
//!
//! Checks its flags, records the start, runs the static pods of its `staticPodPath` as
//! processes, then on SIGTERM (or SIGINT) stops them and exits 0. A refused start exits 1 with
//! the reason, so a supervisor's restart backoff can be exercised.

use hawser_standin::static_pods::StaticPods;
use hawser_standin::{KUBELET_LABEL, StandinEnv, error_chain, kubelet, labelled};
use nix::sys::signal::{SigSet, Signal};

fn main() {
    // Blocked before anything else (and so in every thread), so a SIGTERM that arrives during
    // the checks is waited for below instead of killing the process with a signal status.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    if let Err(e) = signals.thread_block() {
        eprintln!("{KUBELET_LABEL}: error: cannot block SIGTERM: {e}");
        std::process::exit(1);
    }
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_target(false)
        .without_time()
        .with_writer(std::io::stdout)
        .init();
    let env = StandinEnv::from_process();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let start = match kubelet::prepare(&args, &env) {
        Ok(start) => start,
        Err(e) => {
            eprintln!(
                "{}",
                labelled(KUBELET_LABEL, &format!("error: {}", error_chain(&e)))
            );
            std::process::exit(1);
        }
    };
    println!("{}", start.banner());
    if let Some(port) = kubelet::api_server_port(&env) {
        stand_in_for_the_api_server(port);
    }
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let received = signals.wait();
        let _ = stop_tx.send(());
        received
    });
    // The pods run on the main thread: their PR_SET_PDEATHSIG follows the thread that started
    // them, and this one lives as long as the process.
    let mut pods = start
        .static_pod_path
        .clone()
        .map(|dir| StaticPods::new(dir, &start.node, &env.root));
    match &mut pods {
        Some(pods) => pods.run(&stop_rx),
        None => {
            let _ = stop_rx.recv();
        }
    }
    match waiter.join() {
        Ok(Ok(signal)) => {
            kubelet::record_stop(&env, signal.as_str());
            println!("{KUBELET_LABEL}: {} received, exiting", signal.as_str());
        }
        Ok(Err(e)) => {
            eprintln!("{KUBELET_LABEL}: error: waiting for SIGTERM failed: {e}");
            std::process::exit(1);
        }
        Err(_) => {
            eprintln!("{KUBELET_LABEL}: error: the signal thread panicked");
            std::process::exit(1);
        }
    }
}

/// Opens `0.0.0.0:port` for the API server static pod a real kubelet would run: accepts and
/// closes connections (no Kubernetes API), in a thread that ends with the process.
fn stand_in_for_the_api_server(port: u16) {
    match std::net::TcpListener::bind(("0.0.0.0", port)) {
        Ok(listener) => {
            println!(
                "{KUBELET_LABEL}: kube-apiserver static pod not run; listening on 0.0.0.0:{port} \
                 in its place (accepts TCP connections, serves no Kubernetes API)"
            );
            std::thread::spawn(move || {
                for connection in listener.incoming() {
                    drop(connection);
                }
            });
        }
        Err(e) => eprintln!(
            "{KUBELET_LABEL}: error: cannot listen on 0.0.0.0:{port} for the API server: {e}"
        ),
    }
}
