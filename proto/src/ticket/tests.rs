//! The join ticket's wire conversion: a ticket round-trips, an unusable field is refused by
//! name without echoing the token, and the token never stays in the message.

use super::*;
use crate::join::ControlPlaneFile as WireFile;

/// The error and its causes, as one line (what the node logs).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

const TOKEN: &str = "abcdef.0123456789abcdef";
const HASH: &str = "sha256:1234567890abcdef1234567890abcdef1234567890abcdef1234567890abcdef";

fn response() -> IssueJoinTicketResponse {
    IssueJoinTicketResponse {
        api_server_endpoint: "10.0.2.15:6443".into(),
        bootstrap_token: TOKEN.into(),
        discovery_ca_cert_hashes: vec![HASH.into()],
        kubernetes_version: "v1.33.4".into(),
        control_plane_files: vec![WireFile {
            name: "ca.key".into(),
            data: b"key material".to_vec(),
        }],
        ..Default::default()
    }
}

#[test]
fn a_well_formed_ticket_is_taken_and_its_token_wiped_from_the_response() {
    let mut wire = response();
    let ticket = join_ticket_from_wire(&mut wire, false).unwrap();
    assert_eq!(ticket.api_server_endpoint.to_string(), "10.0.2.15:6443");
    assert_eq!(ticket.token.expose_secret(), TOKEN);
    assert_eq!(ticket.ca_cert_hashes, [HASH.parse().unwrap()]);
    assert_eq!(ticket.kubernetes_version, "v1.33.4");
    assert!(ticket.control_plane_files.is_none());
    assert!(
        wire.bootstrap_token.bytes().all(|b| b == 0),
        "token left behind"
    );
    let ticket = join_ticket_from_wire(&mut response(), true).unwrap();
    let files = ticket.control_plane_files.unwrap();
    assert_eq!(files[0].name, "ca.key");
    assert_eq!(*files[0].data, b"key material");
}

#[test]
fn an_unusable_ticket_is_refused_naming_the_field_without_echoing_the_token() {
    type Edit = fn(&mut IssueJoinTicketResponse);
    let cases: [(Edit, &str); 7] = [
        (
            |r| r.api_server_endpoint = "10.0.2.15".into(),
            "API server endpoint \"10.0.2.15\": there is no port",
        ),
        (
            |r| r.api_server_endpoint = "10.0.2.15:99999".into(),
            "API server endpoint \"10.0.2.15:99999\": the port",
        ),
        (
            |r| r.api_server_endpoint = "fd00::1:6443".into(),
            "API server endpoint \"fd00::1:6443\"",
        ),
        (
            |r| r.discovery_ca_cert_hashes = vec!["sha1:abcd".into()],
            "CA certificate hash \"sha1:abcd\"",
        ),
        (
            |r| r.discovery_ca_cert_hashes = vec![HASH.to_uppercase()],
            "CA certificate hash",
        ),
        (
            |r| r.bootstrap_token = "ABCDEF.0123456789abcdef".into(),
            "unusable bootstrap token",
        ),
        (
            |r| r.bootstrap_token = "abcdef.0123456789abcdeF".into(),
            "unusable bootstrap token",
        ),
    ];
    for (edit, message) in cases {
        let mut wire = response();
        edit(&mut wire);
        let secret = wire.bootstrap_token.clone();
        let err = chain(&join_ticket_from_wire(&mut wire, true).unwrap_err());
        assert!(err.contains(message), "{message}: {err}");
        assert!(!err.contains(&secret), "{err}");
        assert!(
            wire.bootstrap_token.bytes().all(|b| b == 0),
            "token left behind"
        );
    }
    // No hash at all is the kubeadm configuration's refusal ("at least one"): not a malformed field.
    let mut wire = response();
    wire.discovery_ca_cert_hashes.clear();
    assert!(
        join_ticket_from_wire(&mut wire, false)
            .unwrap()
            .ca_cert_hashes
            .is_empty()
    );
}

#[test]
fn a_ticket_round_trips_through_the_wire() {
    let ticket = join_ticket_from_wire(&mut response(), true).unwrap();
    let mut wire = IssueJoinTicketResponse::default();
    join_ticket_to_wire(&ticket, &mut wire);
    assert_eq!(wire, response());
    assert_eq!(join_ticket_from_wire(&mut wire, true).unwrap(), ticket);
    let worker = JoinTicket {
        control_plane_files: None,
        ..ticket
    };
    let mut wire = IssueJoinTicketResponse::default();
    join_ticket_to_wire(&worker, &mut wire);
    assert!(wire.control_plane_files.is_empty());
}
