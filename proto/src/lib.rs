//! hawser's wire formats, generated from the `.proto` files in `proto/`.
//!
//! Core logic does not depend on these types (the coordinator README's rule): the attestation,
//! join and init services convert at their edges. `evidence.proto` is what a node sends to
//! prove which image it booted; `join.proto` and `init.proto` (feature `grpc`) are the services
//! a node joins and an admin initializes a cluster through.

/// The generated services, in their package paths (`join.proto` refers to `vpn.proto`'s
/// messages relative to its package).
#[cfg(feature = "grpc")]
mod generated {
    pub mod hawser {
        pub mod join {
            pub mod v1 {
                include!(concat!(env!("OUT_DIR"), "/hawser.join.v1.rs"));
            }
        }
        pub mod init {
            pub mod v1 {
                include!(concat!(env!("OUT_DIR"), "/hawser.init.v1.rs"));
            }
        }
        pub mod vpn {
            pub mod v1 {
                include!(concat!(env!("OUT_DIR"), "/hawser.vpn.v1.rs"));
            }
        }
        pub mod admin {
            pub mod v1 {
                include!(concat!(env!("OUT_DIR"), "/hawser.admin.v1.rs"));
            }
        }
        pub mod attest {
            pub mod v1 {
                include!(concat!(env!("OUT_DIR"), "/hawser.attest.v1.rs"));
            }
        }
    }
}

/// `hawser.join.v1`: a node obtains its state-disk key and join ticket (served by `hawser-joind`).
#[cfg(feature = "grpc")]
pub use generated::hawser::join::v1 as join;

/// `hawser.init.v1`: the admin initializes the first node of a cluster (served by PID 1).
#[cfg(feature = "grpc")]
pub use generated::hawser::init::v1 as init;

/// `hawser.vpn.v1`: the mesh's peer API, served by join services inside the mesh.
#[cfg(feature = "grpc")]
pub use generated::hawser::vpn::v1 as vpn;

/// `hawser.admin.v1`: the admin's releases and revocations (served by `hawser-joind`).
#[cfg(feature = "grpc")]
pub use generated::hawser::admin::v1 as admin;

/// `hawser.attest.v1`: a node's quote of its current state for `hawser verify` (served by PID 1).
#[cfg(feature = "grpc")]
pub use generated::hawser::attest::v1 as attest;

/// Conversions between `hawser.vpn.v1` and the mesh's own types.
#[cfg(feature = "grpc")]
pub mod mesh;

/// Conversions between `hawser.join.v1`'s ticket and the one join ticket (`hawser-kube-types`).
#[cfg(feature = "grpc")]
pub mod ticket;

/// `hawser.evidence.v1`: attestation evidence carried in the attested-TLS certificate.
pub mod evidence {
    include!(concat!(env!("OUT_DIR"), "/hawser.evidence.v1.rs"));
}

#[cfg(test)]
mod tests {
    use super::evidence::{Evidence, Variant};
    use prost::Message;

    #[test]
    fn evidence_round_trips_and_stays_small() {
        let evidence = Evidence {
            version: 1,
            variant: Variant::QemuVtpm as i32,
            ak_public: vec![0xAA; 90],
            quote: vec![0xBB; 145],
            signature: vec![0xCC; 72],
            pcrs_sha256: (0..24).map(|i| (i, vec![i as u8; 32])).collect(),
            ak_cert_chain: vec![vec![0xDD; 600]],
            user_data: Vec::new(),
            nonce: vec![0xEE; 32],
            tls_key_hash: vec![0xFF; 32],
            platform_report: Vec::new(),
            platform_aux: Vec::new(),
        };
        let bytes = evidence.encode_to_vec();
        assert_eq!(Evidence::decode(bytes.as_slice()).unwrap(), evidence);
        // Well inside one TLS handshake message, with room for the certificate around it.
        assert!(bytes.len() < 4096, "evidence is {} bytes", bytes.len());
    }

    #[test]
    fn garbage_is_a_decode_error_not_a_panic() {
        for garbage in [
            &b"\xff\xff\xff\xff"[..],
            b"\x0a\x80",
            b"\x1a\xff\xff\xff\xff\x0f",
        ] {
            assert!(Evidence::decode(garbage).is_err());
        }
    }
}
