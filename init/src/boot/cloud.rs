//! A cloud's part of the bring-up: the address by DHCP when the measured command line names
//! none (a cloud's VM learns its address from the cloud's DHCP server), and the unmeasured
//! settings from the instance metadata service (`hawser.platform`'s source), under the same
//! allow-list as fw_cfg's ([`config::parse_fw_cfg`]): unmeasured input chooses only what
//! attestation makes harmless, and never the init secret hash. Then, on Azure, what the node's
//! evidence needs from the cloud ([`Boot::platform_evidence`]).

use std::time::Duration;

use hawser_platforms::azure::{HardwareReport, HclReport};
use hawser_platforms::node::{AzureAuxRequest, NodeError};
use hawser_platforms::profile::Platform;
use tracing::info;

use super::{Boot, BootError};
use crate::config::{self, CmdlineConfig, FwCfgConfig, NodePlatform};
use crate::platform::metadata::{BaseUrl, MetadataError};
use crate::platform::net::NetConfig;
use crate::platform::{dhcp, metadata};

/// How long the first NIC may take to get a DHCP lease.
const DHCP_DEADLINE: Duration = Duration::from_secs(60);
/// How long the metadata service may take to answer (it is up before the VM boots; the
/// retries cover a network that is still coming up).
const METADATA_DEADLINE: Duration = Duration::from_secs(60);
/// How long Azure's metadata service may take to give the VCEK chain or the TD quote.
const AZURE_AUX_DEADLINE: Duration = Duration::from_secs(60);

/// Why this node cannot present its platform's evidence.
#[derive(Debug, thiserror::Error)]
pub enum PlatformEvidenceError {
    /// `hawser.platform=aws`: nothing verifies a NitroTPM's evidence yet.
    #[error(
        "hawser.platform=aws: AWS NitroTPM evidence has no hawser profile yet (docs/platforms.md), \
         so this node cannot attest to its cluster; boot the image on a platform with a profile \
         (qemu, gce, azure)"
    )]
    Aws,
    /// No HCL report: not an Azure confidential VM.
    #[error(
        "hawser.platform={named}: NV index 0x01400001 (the HCL report) is not defined on this \
         TPM: this VM is not an Azure confidential VM (SEV-SNP or TDX)"
    )]
    NoHclReport { named: NodePlatform },
    /// The HCL report cannot be read from the TPM, or not used for the evidence.
    #[error("hawser.platform={named}: cannot use the HCL report in NV 0x01400001")]
    ReadHcl {
        named: NodePlatform,
        #[source]
        source: Box<NodeError>,
    },
    /// The HCL report does not parse.
    #[error("hawser.platform={named}: the HCL report in NV 0x01400001 is unusable")]
    Hcl {
        named: NodePlatform,
        #[source]
        source: Box<hawser_platforms::azure::AzureError>,
    },
    /// The command line names one Azure profile, the CPU's report is the other's.
    #[error(
        "hawser.platform={named}, but the HCL report in NV 0x01400001 holds {} report: this VM \
         is an {detected} confidential VM, whose evidence the cluster's {named} measurements \
         would refuse; boot an image built with hawser.platform={detected} (or azure)",
        cpu_report(*.detected)
    )]
    Mismatch { named: Platform, detected: Platform },
    /// Azure's metadata service gave no VCEK chain or TD quote.
    #[error("cannot fetch {what} from Azure's metadata service: {platform} evidence needs it")]
    Aux {
        what: &'static str,
        platform: Platform,
        #[source]
        source: MetadataError,
    },
}

/// "an SEV-SNP", "a TDX": the CPU report an Azure profile's HCL report holds.
fn cpu_report(profile: Platform) -> &'static str {
    match profile {
        Platform::AzureTdx => "a TDX",
        _ => "an SEV-SNP",
    }
}

/// The Azure profile of a node named `named` (`azure`, `azure-snp` or `azure-tdx`) whose HCL
/// report is `hcl_report`: the report's CPU decides; a profile by name must be that one.
pub(super) fn azure_profile(
    named: NodePlatform,
    hcl_report: &[u8],
) -> Result<Platform, PlatformEvidenceError> {
    let hcl = HclReport::parse(hcl_report).map_err(|source| PlatformEvidenceError::Hcl {
        named,
        source: Box::new(source),
    })?;
    let detected = match hcl.kind {
        HardwareReport::SevSnp => Platform::AzureSnp,
        HardwareReport::Tdx => Platform::AzureTdx,
    };
    match named {
        NodePlatform::Profile(profile) if profile != detected => {
            Err(PlatformEvidenceError::Mismatch {
                named: profile,
                detected,
            })
        }
        _ => Ok(detected),
    }
}

impl Boot {
    /// On a cloud platform without `hawser.net`: the first NIC's address by DHCP, recorded in
    /// `config.net` (the underlay address the node's tunnel and Kubernetes use). Whether it
    /// leased (else `hawser.net` is brought up as on QEMU).
    pub(super) async fn lease_net(
        &mut self,
        config: &mut CmdlineConfig,
    ) -> Result<bool, BootError> {
        if config.net.is_some() || config.platform.metadata_source().is_none() {
            return Ok(false);
        }
        let configured = self
            .time_async("dhcp", dhcp::dhcp_configure(DHCP_DEADLINE))
            .await?;
        let lease = &configured.lease;
        info!(
            "network: {} is {}/{} by DHCP from {}{}{}",
            configured.interface,
            lease.address,
            lease.prefix_len,
            lease.server,
            lease
                .gateway
                .map(|g| format!(" via {g}"))
                .unwrap_or_default(),
            lease.mtu.map(|m| format!(", MTU {m}")).unwrap_or_default(),
        );
        config.net = Some(NetConfig {
            address: lease.address,
            prefix_len: lease.prefix_len,
            gateway: lease.gateway,
        });
        Ok(true)
    }

    /// The hawser keys of the platform's instance metadata, merged under fw_cfg's: a key fw_cfg
    /// gave keeps fw_cfg's value.
    pub(super) async fn read_metadata(
        &mut self,
        config: &CmdlineConfig,
        fw_cfg: &mut FwCfgConfig,
    ) -> Result<(), BootError> {
        let Some(source) = config.platform.metadata_source() else {
            return Ok(());
        };
        let keys = self
            .time_async(
                "metadata",
                metadata::read_hawser_keys(source, METADATA_DEADLINE),
            )
            .await?;
        let names = keys.names().join(", ");
        let parsed = config::parse_fw_cfg(&keys)?;
        drop(keys);
        for warning in &parsed.warnings {
            self.warn(format!("{source} instance metadata: {warning}"));
        }
        info!(
            "{source} instance metadata: {}",
            if names.is_empty() {
                "no hawser keys"
            } else {
                &names
            }
        );
        merge_under(fw_cfg, parsed);
        Ok(())
    }
}

impl Boot {
    /// What the node's evidence needs from its cloud, after the network is up. On Azure
    /// (`azure`, `azure-snp`, `azure-tdx`): the HCL report from the TPM's NV decides SNP or TDX
    /// (a profile by name must match it), the boot attests as that profile, and the metadata
    /// service's VCEK chain (SNP) or TD quote (TDX) is kept for every evidence
    /// ([`crate::attest::issuer`]). `aws` fails: no profile verifies NitroTPM evidence yet.
    /// Nothing on the other platforms.
    pub(super) async fn platform_evidence(
        &mut self,
        config: &CmdlineConfig,
    ) -> Result<(), BootError> {
        let named = config.platform;
        match named {
            NodePlatform::Aws => return Err(PlatformEvidenceError::Aws.into()),
            NodePlatform::Azure
            | NodePlatform::Profile(Platform::AzureSnp | Platform::AzureTdx) => {}
            NodePlatform::Qemu | NodePlatform::Profile(_) => return Ok(()),
        }
        let tpm = self.tpm()?;
        // Both Azure profiles keep the same NV indices.
        let layout = named.profile().unwrap_or(Platform::AzureSnp);
        let nv = self
            .time_blocking("azure-hcl", move || {
                hawser_platforms::node::gather_nv(&tpm, layout)
            })
            .await?
            .map_err(|source| match source {
                NodeError::Missing { .. } => PlatformEvidenceError::NoHclReport { named },
                source => PlatformEvidenceError::ReadHcl {
                    named,
                    source: Box::new(source),
                },
            })?;
        let report = nv
            .get(&hawser_platforms::azure::HCL_REPORT_NV_INDEX)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let profile = azure_profile(named, report)?;
        crate::attest::set_platform(profile);
        let request =
            hawser_platforms::node::azure_aux_request(profile, report).map_err(|source| {
                PlatformEvidenceError::ReadHcl {
                    named,
                    source: Box::new(source),
                }
            })?;
        let fetched = match &request {
            AzureAuxRequest::VcekChain => {
                self.time_async(
                    "azure-evidence",
                    metadata::azure_vcek_chain(BaseUrl::default(), AZURE_AUX_DEADLINE),
                )
                .await
            }
            AzureAuxRequest::TdQuote { td_report } => {
                self.time_async(
                    "azure-evidence",
                    metadata::azure_td_quote(BaseUrl::default(), td_report, AZURE_AUX_DEADLINE),
                )
                .await
            }
        };
        let aux = fetched.map_err(|source| PlatformEvidenceError::Aux {
            what: request.what(),
            platform: profile,
            source,
        })?;
        info!(
            "platform: {profile} (the HCL report holds {} report); {} bytes of {} from Azure's \
             metadata service",
            cpu_report(profile),
            aux.len(),
            request.what()
        );
        crate::attest::set_azure_aux(request, aux);
        Ok(())
    }
}

/// Fills what `fw_cfg` lacks from `metadata`. The quote nonce is never taken from metadata
/// (the boot's quote is made before the network is up).
fn merge_under(fw_cfg: &mut FwCfgConfig, metadata: FwCfgConfig) {
    let FwCfgConfig {
        quote_nonce: _,
        state_disk_key,
        join_endpoint,
        control_plane,
        vpn_endpoint,
        lan_net,
        warnings: _,
    } = metadata;
    if fw_cfg.state_disk_key.is_none() {
        fw_cfg.state_disk_key = state_disk_key;
    }
    if fw_cfg.join_endpoint.is_none() {
        fw_cfg.join_endpoint = join_endpoint;
    }
    fw_cfg.control_plane |= control_plane;
    if fw_cfg.vpn_endpoint.is_none() {
        fw_cfg.vpn_endpoint = vpn_endpoint;
    }
    if fw_cfg.lan_net.is_none() {
        fw_cfg.lan_net = lan_net;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn metadata_fills_only_what_fw_cfg_left_open() {
        let entries = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let mut fw_cfg =
            config::parse_fw_cfg(&entries(&[("join_endpoint", "10.0.2.100:7000")])).unwrap();
        let metadata = config::parse_fw_cfg(&entries(&[
            ("join_endpoint", "169.254.169.100:7000"),
            ("role", "control-plane"),
            ("quote_nonce", "abcd"),
        ]))
        .unwrap();
        merge_under(&mut fw_cfg, metadata);
        assert_eq!(
            fw_cfg.join_endpoint,
            crate::enrollment::JoinEndpoints::parse("10.0.2.100:7000")
        );
        assert!(fw_cfg.control_plane);
        assert_eq!(fw_cfg.quote_nonce, None);
    }

    /// A file of platforms/tests/vectors/azure/ (see the vectors' README for where each comes
    /// from).
    fn azure_vector(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../platforms/tests/vectors/azure/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The HCL report of trustee's Azure SEV-SNP capture (Genoa).
    fn snp_hcl_report() -> Vec<u8> {
        let json: serde_json::Value =
            serde_json::from_slice(&azure_vector("evidence-genoa.json")).unwrap();
        serde_json::from_value(json["report"].clone()).unwrap()
    }

    /// The HCL report of flashbots' Azure TDX capture.
    fn tdx_hcl_report() -> Vec<u8> {
        use base64::Engine as _;
        let yaml = String::from_utf8(azure_vector(
            "azure-tdx-with-ak-intermediates-1780922561.yaml",
        ))
        .unwrap();
        let mut lines = yaml.lines();
        lines.find(|line| *line == "hcl_report_base64: >-").unwrap();
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(lines.next().unwrap().trim().trim_end_matches('='))
            .unwrap()
    }

    #[test]
    fn an_azure_node_attests_as_the_cpu_its_hcl_report_holds() {
        let (snp, tdx) = (snp_hcl_report(), tdx_hcl_report());
        assert_eq!(
            azure_profile(NodePlatform::Azure, &snp).unwrap(),
            Platform::AzureSnp
        );
        assert_eq!(
            azure_profile(NodePlatform::Azure, &tdx).unwrap(),
            Platform::AzureTdx
        );
        for profile in [Platform::AzureSnp, Platform::AzureTdx] {
            let report = if profile == Platform::AzureSnp {
                &snp
            } else {
                &tdx
            };
            assert_eq!(
                azure_profile(NodePlatform::Profile(profile), report).unwrap(),
                profile
            );
        }
        // What the node asks the metadata service for follows from the same report.
        assert_eq!(
            hawser_platforms::node::azure_aux_request(Platform::AzureSnp, &snp).unwrap(),
            AzureAuxRequest::VcekChain
        );
        assert!(matches!(
            hawser_platforms::node::azure_aux_request(Platform::AzureTdx, &tdx).unwrap(),
            AzureAuxRequest::TdQuote { td_report } if td_report == tdx[32..32 + 1024]
        ));
    }

    #[test]
    fn an_azure_profile_by_name_is_refused_on_the_other_cpu_naming_both() {
        let error = azure_profile(NodePlatform::Profile(Platform::AzureSnp), &tdx_hcl_report())
            .unwrap_err();
        assert!(
            matches!(
                error,
                PlatformEvidenceError::Mismatch {
                    named: Platform::AzureSnp,
                    detected: Platform::AzureTdx
                }
            ),
            "{error}"
        );
        assert_eq!(
            error.to_string(),
            "hawser.platform=azure-snp, but the HCL report in NV 0x01400001 holds a TDX report: \
             this VM is an azure-tdx confidential VM, whose evidence the cluster's azure-snp \
             measurements would refuse; boot an image built with hawser.platform=azure-tdx (or \
             azure)"
        );
        let error = azure_profile(NodePlatform::Profile(Platform::AzureTdx), &snp_hcl_report())
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(
                "hawser.platform=azure-tdx, but the HCL report in NV 0x01400001 holds an \
                 SEV-SNP report"
            ),
            "{error}"
        );

        let mut garbage = snp_hcl_report();
        garbage[..4].copy_from_slice(b"XXXX");
        let error = azure_profile(NodePlatform::Azure, &garbage).unwrap_err();
        assert!(
            matches!(error, PlatformEvidenceError::Hcl { .. }),
            "{error}"
        );
        let chain = crate::platform::error_chain(&error);
        assert!(chain.contains("not \"HCLA\""), "{chain}");
    }

    #[test]
    fn an_aws_node_is_refused_naming_the_missing_profile() {
        let error = BootError::from(PlatformEvidenceError::Aws).to_string();
        assert!(
            error.contains("AWS NitroTPM evidence has no hawser profile yet (docs/platforms.md)"),
            "{error}"
        );
    }

    #[test]
    fn the_init_secret_hash_never_comes_from_metadata() {
        let entries = [("init_secret_hash".to_owned(), vec![b'0'; 64])].into();
        let parsed = config::parse_fw_cfg(&entries).unwrap();
        assert_eq!(parsed.warnings, vec![config::INIT_SECRET_HASH_FROM_FW_CFG]);
    }
}
