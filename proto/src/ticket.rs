//! Conversions between `hawser.join.v1`'s join ticket fields and the one join ticket
//! ([`hawser_kube_types::JoinTicket`]), for the join service (out) and PID 1 (in). Everything
//! from the wire is checked here: the token, the API server endpoint, the CA certificate
//! hashes. The token is wiped from the message whether or not it is usable.

use hawser_kube_types::{
    ApiServerEndpoint, BootstrapToken, CaCertHash, ControlPlaneFile, EndpointError, JoinTicket,
};
use zeroize::Zeroizing;

use crate::join::{self, IssueJoinTicketResponse};

/// An `IssueJoinTicketResponse` whose ticket does not convert. The messages name the field and
/// its value, never the token.
#[derive(Debug, thiserror::Error)]
pub enum TicketError {
    /// The bootstrap token is not `[a-z0-9]{6}.[a-z0-9]{16}`.
    #[error("the join service sent an unusable bootstrap token")]
    Token(#[source] hawser_kube_types::BootstrapTokenError),
    /// The API server endpoint is not `host:port`.
    #[error("the join service sent an unusable API server endpoint {text:?}")]
    ApiServerEndpoint {
        text: String,
        #[source]
        source: EndpointError,
    },
    /// A CA certificate hash is not `sha256:<64 lowercase hex>`.
    #[error("the join service sent an unusable CA certificate hash {text:?}")]
    CaCertHash {
        text: String,
        #[source]
        source: hawser_kube_types::CaCertHashError,
    },
}

/// Puts `ticket` into the join service's answer (the token in clear: the answer travels over
/// aTLS to the attested node only). A worker's ticket has no control-plane files.
pub fn join_ticket_to_wire(ticket: &JoinTicket, response: &mut IssueJoinTicketResponse) {
    response.api_server_endpoint = ticket.api_server_endpoint.to_string();
    response.bootstrap_token = ticket.token.expose_secret().to_owned();
    response.discovery_ca_cert_hashes = ticket
        .ca_cert_hashes
        .iter()
        .map(ToString::to_string)
        .collect();
    response.kubernetes_version = ticket.kubernetes_version.clone();
    response.control_plane_files = ticket
        .control_plane_files
        .iter()
        .flatten()
        .map(|file| join::ControlPlaneFile {
            name: file.name.clone(),
            data: file.data.to_vec(),
        })
        .collect();
}

/// The join ticket of `response`, checked: the token (wiped from the response whether or not
/// it is usable), the API server endpoint and the CA certificate hashes. The control-plane
/// files are taken for a control-plane node (`control_plane`), left for the caller to wipe
/// otherwise.
pub fn join_ticket_from_wire(
    response: &mut IssueJoinTicketResponse,
    control_plane: bool,
) -> Result<JoinTicket, TicketError> {
    let token = response
        .bootstrap_token
        .parse::<BootstrapToken>()
        .map_err(TicketError::Token);
    zeroize::Zeroize::zeroize(&mut response.bootstrap_token);
    let token = token?;
    let api_server_endpoint = response
        .api_server_endpoint
        .parse::<ApiServerEndpoint>()
        .map_err(|source| TicketError::ApiServerEndpoint {
            text: response.api_server_endpoint.clone(),
            source,
        })?;
    let ca_cert_hashes = response
        .discovery_ca_cert_hashes
        .iter()
        .map(|hash| {
            hash.parse::<CaCertHash>()
                .map_err(|source| TicketError::CaCertHash {
                    text: hash.clone(),
                    source,
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(JoinTicket {
        api_server_endpoint,
        token,
        ca_cert_hashes,
        kubernetes_version: std::mem::take(&mut response.kubernetes_version),
        control_plane_files: control_plane.then(|| {
            response
                .control_plane_files
                .iter_mut()
                .map(|file| ControlPlaneFile {
                    name: std::mem::take(&mut file.name),
                    data: Zeroizing::new(std::mem::take(&mut file.data)),
                })
                .collect()
        }),
    })
}

#[cfg(test)]
mod tests;
