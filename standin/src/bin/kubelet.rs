//! `kubelet` STAND-IN (not Kubernetes): see the hawser-standin crate.
//!
//! Checks its flags, records the start, then waits for SIGTERM (or SIGINT) and exits 0. A
//! refused start exits 1 with the reason, so a supervisor's restart backoff can be exercised.

use hawser_standin::{KUBELET_LABEL, StandinEnv, error_chain, kubelet, labelled};
use nix::sys::signal::{SigSet, Signal};

fn main() {
    // Blocked before anything else, so a SIGTERM that arrives during the checks is waited for
    // below instead of killing the process with a signal status.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    if let Err(e) = signals.thread_block() {
        eprintln!("{KUBELET_LABEL}: error: cannot block SIGTERM: {e}");
        std::process::exit(1);
    }
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
    match signals.wait() {
        Ok(signal) => {
            kubelet::record_stop(&env, signal.as_str());
            println!("{KUBELET_LABEL}: {} received, exiting", signal.as_str());
        }
        Err(e) => {
            eprintln!("{KUBELET_LABEL}: error: waiting for SIGTERM failed: {e}");
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
