//! A TCP probe of every candidate at once, before a round of join attempts.
//!
//! A join attempt is slow by design (an aTLS handshake with a TPM quote on each side, up to
//! 30 s), and an endpoint that does not answer at all used to cost a whole attempt: 5000
//! blackholed adverts, 42 hours (issue 28). A real join service answers a TCP connection in
//! milliseconds, even under TCG, so the node first connects to every candidate at once
//! ([`PROBE_CONCURRENCY`] at a time, [`PROBE_TIMEOUT`] each) and closes the connection; only
//! those that accepted are attempted. The probe sends nothing: a join service sees a connection
//! closed before its TLS handshake.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::task::JoinSet;

/// How long a probe waits for the TCP handshake. A join service on the LAN answers in
/// milliseconds; an address nobody holds fails its ARP resolution after ~3 s and a blackholed
/// one never answers: both are cut short here.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How many probes run at once (each holds a socket while it waits): a round's whole budget
/// ([`crate::lan::PROBE_BUDGET`]).
pub const PROBE_CONCURRENCY: usize = 256;

/// Connects to each of `endpoints` (at most [`PROBE_CONCURRENCY`] at a time, `timeout` each)
/// and reports, in their order, whether it accepted. Must be called within a tokio runtime.
pub async fn probe(endpoints: &[SocketAddr], timeout: Duration) -> Vec<bool> {
    let mut answered = vec![false; endpoints.len()];
    for (batch, chunk) in endpoints.chunks(PROBE_CONCURRENCY).enumerate() {
        let mut probes = JoinSet::new();
        for (i, &endpoint) in chunk.iter().enumerate() {
            probes.spawn(async move {
                let connected = tokio::time::timeout(timeout, TcpStream::connect(endpoint)).await;
                let ok = matches!(connected, Ok(Ok(_)));
                if let Ok(Err(error)) = connected {
                    tracing::debug!(%endpoint, %error, "probe: no join service there");
                }
                (batch * PROBE_CONCURRENCY + i, ok)
            });
        }
        while let Some(done) = probes.join_next().await {
            if let Ok((index, ok)) = done {
                answered[index] = ok;
            }
        }
    }
    answered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_answers_and_a_closed_port_does_not() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let open = listener.local_addr().unwrap();
            let closed = {
                let gone = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                gone.local_addr().unwrap()
            };
            let mut endpoints = vec![closed; 300];
            endpoints[7] = open;
            endpoints[250] = open;
            let answered = probe(&endpoints, Duration::from_secs(1)).await;
            let which: Vec<usize> = (0..300).filter(|&i| answered[i]).collect();
            assert_eq!(which, [7, 250]);
        });
    }
}
