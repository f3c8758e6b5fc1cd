//! SIGTERM, SIGINT and SIGPWR become shutdown requests. Its own test binary: it installs
//! process-wide signal handlers and signals itself.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::time::Duration;

use hawser_init::boot::{ShutdownRequest, listen_for_signals};
use nix::sys::signal::{Signal, raise};

#[tokio::test(flavor = "current_thread")]
async fn termination_signals_request_a_shutdown() {
    let (requests, mut requested) = tokio::sync::mpsc::channel(4);
    listen_for_signals(&requests).unwrap();
    for (signal, name) in [
        (Signal::SIGTERM, "SIGTERM"),
        (Signal::SIGINT, "SIGINT"),
        (Signal::SIGPWR, "SIGPWR"),
    ] {
        raise(signal).unwrap();
        let request = tokio::time::timeout(Duration::from_secs(5), requested.recv())
            .await
            .unwrap_or_else(|_| panic!("no shutdown request after {name}"));
        assert_eq!(request, Some(ShutdownRequest::Signal(name)));
    }
    // SIGHUP is not a shutdown request (and its default action would end this test binary,
    // so it is not raised; SIGUSR1 stands in for "any other signal").
    let _ = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()).unwrap();
    raise(Signal::SIGUSR1).unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), requested.recv())
            .await
            .is_err()
    );
}
