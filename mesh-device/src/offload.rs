//! The tun device's offloads in user space: the `virtio_net_hdr` in front of every packet
//! (`IFF_VNET_HDR`), TCP segmentation of the kernel's super-packets (`TUN_F_TSO4`/`TSO6`,
//! `TUN_F_CSUM`) before encryption, and the reverse on receive: consecutive segments of one TCP
//! flow coalesced into one super-packet the kernel takes in one write (as the kernel's GRO
//! would). The same rules as wireguard-go's `tun/offload_linux.go` and the kernel's
//! `tcp_gso_segment` / `tcp_gro_receive`.
//!
//! Everything here is pure: byte slices in, byte slices out, no panics on any input (a packet
//! that does not parse is refused with [`OffloadError`]).

/// The `virtio_net_hdr` the tun device puts in front of every packet (native byte order).
pub const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum from `csum_start` on is still to be computed.
pub const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_NONE`.
pub const GSO_NONE: u8 = 0;
/// `VIRTIO_NET_HDR_GSO_TCPV4`.
pub const GSO_TCPV4: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_TCPV6`.
pub const GSO_TCPV6: u8 = 4;
/// `VIRTIO_NET_HDR_GSO_ECN`, or-ed into the type.
pub const GSO_ECN: u8 = 0x80;
/// The largest IP packet: what a coalesced super-packet may grow to.
pub const MAX_PACKET: usize = 65535;

const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_ACK: u8 = 0x10;
const TCP_CWR: u8 = 0x80;
const IPPROTO_TCP: u8 = 6;

/// Why a packet from the tun device could not be segmented or completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OffloadError {
    /// Shorter than its headers say.
    #[error("packet truncated")]
    Truncated,
    /// A GSO type this tunnel did not ask for.
    #[error("unsupported GSO type {0}")]
    GsoType(u8),
    /// A super-packet that is not plain TCP over IPv4 or IPv6 (options or extension headers the
    /// segmentation does not follow), or with a segment size of 0.
    #[error("super-packet not segmentable")]
    NotSegmentable,
    /// The checksum position lies outside the packet.
    #[error("checksum position outside the packet")]
    ChecksumPosition,
}

/// A `virtio_net_hdr`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VnetHdr {
    /// `F_NEEDS_CSUM` or 0.
    pub flags: u8,
    /// `GSO_*`.
    pub gso_type: u8,
    /// The headers' length (advisory).
    pub hdr_len: u16,
    /// The payload of each segment.
    pub gso_size: u16,
    /// Where the checksum starts.
    pub csum_start: u16,
    /// Where, from `csum_start`, it goes.
    pub csum_offset: u16,
}

impl VnetHdr {
    /// Reads a header; `None` if `bytes` is shorter than [`VNET_HDR_LEN`].
    pub fn decode(bytes: &[u8]) -> Option<VnetHdr> {
        let b = bytes.get(..VNET_HDR_LEN)?;
        let u16_at = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        })
    }

    /// Writes the header into the first [`VNET_HDR_LEN`] bytes (nothing if shorter).
    pub fn encode(&self, bytes: &mut [u8]) {
        let Some(b) = bytes.get_mut(..VNET_HDR_LEN) else {
            return;
        };
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
    }
}

/// The one's-complement sum of `data` added to `initial`, not folded.
pub fn checksum_add(data: &[u8], initial: u64) -> u64 {
    let mut sum = initial;
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        // Sums of big-endian 32-bit halves: the carries of each fit in the upper bits.
        let value = u64::from_be_bytes(word);
        sum += value >> 32;
        sum += value & 0xffff_ffff;
    }
    let rest = chunks.remainder();
    let mut pairs = rest.chunks_exact(2);
    for pair in &mut pairs {
        sum += u64::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    if let [last] = pairs.remainder() {
        sum += u64::from(*last) << 8;
    }
    sum
}

/// Folds a sum into 16 bits (not complemented).
pub fn checksum_fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // The loop leaves at most 16 bits.
    u16::try_from(sum).unwrap_or(0xffff)
}

/// The internet checksum of `data` (complemented).
pub fn checksum(data: &[u8]) -> u16 {
    !checksum_fold(checksum_add(data, 0))
}

/// The pseudo-header's sum: the addresses, the protocol and the transport length.
fn pseudo_header_sum(src: &[u8], dst: &[u8], protocol: u8, length: usize) -> u64 {
    let sum = checksum_add(src, 0);
    let sum = checksum_add(dst, sum);
    sum + u64::from(protocol) + length as u64
}

/// Where an IP packet's transport header starts, its protocol and its address bytes.
struct IpInfo {
    v6: bool,
    header_len: usize,
    protocol: u8,
}

fn ip_info(packet: &[u8]) -> Option<IpInfo> {
    match packet.first()? >> 4 {
        4 => {
            let header_len = usize::from(packet[0] & 0x0f) * 4;
            if header_len < 20 || packet.len() < header_len {
                return None;
            }
            Some(IpInfo {
                v6: false,
                header_len,
                protocol: packet[9],
            })
        }
        6 => {
            if packet.len() < 40 {
                return None;
            }
            Some(IpInfo {
                v6: true,
                header_len: 40,
                protocol: packet[6],
            })
        }
        _ => None,
    }
}

fn addresses(packet: &[u8], v6: bool) -> (&[u8], &[u8]) {
    if v6 {
        (&packet[8..24], &packet[24..40])
    } else {
        (&packet[12..16], &packet[16..20])
    }
}

/// Completes a `F_NEEDS_CSUM` packet without GSO: the sum from `csum_start` to the end (the
/// field already holds the pseudo-header's sum) goes into the field.
pub fn complete_checksum(packet: &mut [u8], hdr: &VnetHdr) -> Result<(), OffloadError> {
    let start = usize::from(hdr.csum_start);
    let at = start + usize::from(hdr.csum_offset);
    if at + 2 > packet.len() || start > packet.len() {
        return Err(OffloadError::ChecksumPosition);
    }
    let sum = checksum(&packet[start..]);
    packet[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    Ok(())
}

/// Splits a TCP super-packet (`hdr.gso_type` TCPV4 or TCPV6) into segments of at most
/// `hdr.gso_size` payload bytes each, every one a complete IP packet with correct lengths,
/// IPv4 identification and header checksum, TCP sequence number, flags (FIN and PSH on the
/// last only, CWR on the first only) and TCP checksum. `emit` gets each segment in turn, in
/// `scratch` (at least 65535 bytes long, or segments that do not fit are refused).
pub fn segment(
    packet: &[u8],
    hdr: &VnetHdr,
    scratch: &mut [u8],
    mut emit: impl FnMut(&[u8]),
) -> Result<(), OffloadError> {
    let gso_type = hdr.gso_type & !GSO_ECN;
    if gso_type != GSO_TCPV4 && gso_type != GSO_TCPV6 {
        return Err(OffloadError::GsoType(hdr.gso_type));
    }
    let ip = ip_info(packet).ok_or(OffloadError::Truncated)?;
    if ip.protocol != IPPROTO_TCP || ip.v6 != (gso_type == GSO_TCPV6) {
        return Err(OffloadError::NotSegmentable);
    }
    let tcp_start = ip.header_len;
    let doff = usize::from(*packet.get(tcp_start + 12).ok_or(OffloadError::Truncated)? >> 4) * 4;
    if doff < 20 {
        return Err(OffloadError::NotSegmentable);
    }
    let headers = tcp_start + doff;
    if packet.len() < headers {
        return Err(OffloadError::Truncated);
    }
    let gso_size = usize::from(hdr.gso_size);
    if gso_size == 0 {
        return Err(OffloadError::NotSegmentable);
    }
    if headers + gso_size > scratch.len() {
        return Err(OffloadError::NotSegmentable);
    }
    let payload = &packet[headers..];
    let seq = u32::from_be_bytes([
        packet[tcp_start + 4],
        packet[tcp_start + 5],
        packet[tcp_start + 6],
        packet[tcp_start + 7],
    ]);
    let ip_id = u16::from_be_bytes([packet[4], packet[5]]);
    let flags = packet[tcp_start + 13];
    let (src, dst) = addresses(packet, ip.v6);
    let pseudo_addresses = checksum_add(dst, checksum_add(src, 0)) + u64::from(IPPROTO_TCP);
    let count = payload.len().div_ceil(gso_size).max(1);
    for (i, offset) in (0..count).map(|i| (i, i * gso_size)) {
        let end = (offset + gso_size).min(payload.len());
        let chunk = &payload[offset..end];
        let length = headers + chunk.len();
        let out = &mut scratch[..length];
        out[..headers].copy_from_slice(&packet[..headers]);
        out[headers..].copy_from_slice(chunk);
        // The IP header: lengths, identification, checksum.
        if ip.v6 {
            let payload_len = u16::try_from(length - 40).map_err(|_| OffloadError::Truncated)?;
            out[4..6].copy_from_slice(&payload_len.to_be_bytes());
        } else {
            let total = u16::try_from(length).map_err(|_| OffloadError::Truncated)?;
            out[2..4].copy_from_slice(&total.to_be_bytes());
            // `i` < 65536 segments: the wrap is the kernel's too.
            let id = ip_id.wrapping_add(u16::try_from(i & 0xffff).unwrap_or(0));
            out[4..6].copy_from_slice(&id.to_be_bytes());
            out[10..12].copy_from_slice(&[0, 0]);
            let sum = checksum(&out[..ip.header_len]);
            out[10..12].copy_from_slice(&sum.to_be_bytes());
        }
        // The TCP header: sequence number, flags, checksum.
        let segment_seq = seq.wrapping_add(u32::try_from(offset).unwrap_or(0));
        out[tcp_start + 4..tcp_start + 8].copy_from_slice(&segment_seq.to_be_bytes());
        let mut segment_flags = flags;
        if i + 1 < count {
            segment_flags &= !(TCP_FIN | TCP_PSH);
        }
        if i > 0 {
            segment_flags &= !TCP_CWR;
        }
        out[tcp_start + 13] = segment_flags;
        out[tcp_start + 16..tcp_start + 18].copy_from_slice(&[0, 0]);
        let tcp_len = length - tcp_start;
        let sum = !checksum_fold(checksum_add(
            &out[tcp_start..],
            pseudo_addresses + tcp_len as u64,
        ));
        out[tcp_start + 16..tcp_start + 18].copy_from_slice(&sum.to_be_bytes());
        emit(out);
    }
    Ok(())
}

/// What makes consecutive TCP segments one flow's, in the order they were sent.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FlowKey {
    v6: bool,
    addresses: [u8; 32],
    ports: [u8; 4],
}

/// A TCP segment a [`Coalescer`] may merge: its place in its packet.
#[derive(Debug, Clone)]
struct TcpSegment {
    key: FlowKey,
    ip_header_len: usize,
    tcp_header_len: usize,
    seq: u32,
    flags: u8,
}

/// Parses a segment that may be coalesced: plain IPv4 (no options, not a fragment) or IPv6
/// (no extension header) TCP with only ACK (and PSH) set and a payload.
fn coalescable(packet: &[u8]) -> Option<TcpSegment> {
    let ip = ip_info(packet)?;
    if ip.protocol != IPPROTO_TCP {
        return None;
    }
    let total = if ip.v6 {
        40 + usize::from(u16::from_be_bytes([packet[4], packet[5]]))
    } else {
        if ip.header_len != 20 {
            return None;
        }
        // More fragments or a fragment offset.
        if u16::from_be_bytes([packet[6], packet[7]]) & 0x3fff != 0 {
            return None;
        }
        usize::from(u16::from_be_bytes([packet[2], packet[3]]))
    };
    if total != packet.len() {
        return None;
    }
    let tcp = packet.get(ip.header_len..)?;
    let tcp_header_len = usize::from(*tcp.get(12)? >> 4) * 4;
    if tcp_header_len < 20 || tcp.len() <= tcp_header_len {
        return None;
    }
    let flags = tcp[13];
    if flags & !(TCP_PSH) != TCP_ACK {
        return None;
    }
    let mut addresses = [0u8; 32];
    let (src, dst) = addresses_of(packet, ip.v6);
    addresses[..src.len()].copy_from_slice(src);
    addresses[16..16 + dst.len()].copy_from_slice(dst);
    Some(TcpSegment {
        key: FlowKey {
            v6: ip.v6,
            addresses,
            ports: [tcp[0], tcp[1], tcp[2], tcp[3]],
        },
        ip_header_len: ip.header_len,
        tcp_header_len,
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        flags,
    })
}

fn addresses_of(packet: &[u8], v6: bool) -> (&[u8], &[u8]) {
    addresses(packet, v6)
}

/// One packet the coalescer hands back: a super-packet it built (with its `virtio_net_hdr`
/// first), or the index of a packet to be written as it is.
#[derive(Debug, PartialEq, Eq)]
pub enum Coalesced {
    /// Write `Coalescer::super_packet(i)` (header included).
    Merged(usize),
    /// Write the `i`-th packet given, unchanged.
    Single(usize),
}

/// One flow's super-packet being built.
struct Item {
    segment: TcpSegment,
    /// The packet index of its first segment (a single packet until a second joins).
    first: usize,
    /// Into `buffers`, once a second segment joined.
    buffer: Option<usize>,
    /// The bytes so far (headers of the first, payloads of all).
    length: usize,
    gso_size: usize,
    next_seq: u32,
    /// A shorter or PSH segment ended it.
    closed: bool,
    merged: usize,
}

/// Coalesces consecutive TCP segments of one flow (same addresses, ports, IP header fields but
/// the length/id/checksum, same TCP header but sequence number, PSH and checksum; sequence
/// numbers following on; every segment but the last exactly the first's size) into
/// super-packets with `F_NEEDS_CSUM` and `GSO_TCPV4`/`TCPV6`, the TCP checksum field holding
/// the pseudo-header's sum (what the kernel completes). Everything else is handed back as a
/// single packet, in order within each flow.
///
/// The checksums of the segments themselves are not checked: they arrived authenticated by
/// WireGuard, and the kernel's WireGuard marks such packets as checked too.
#[derive(Default)]
pub struct Coalescer {
    items: Vec<Item>,
    buffers: Vec<Vec<u8>>,
    order: Vec<Slot>,
}

/// A place in the write order.
#[derive(Debug, Clone, Copy)]
enum Slot {
    /// A packet that is no TCP segment to merge.
    Packet(usize),
    /// An item (one segment or more).
    Item(usize),
}

impl Coalescer {
    /// Starts a batch.
    pub fn clear(&mut self) {
        self.items.clear();
        self.order.clear();
    }

    /// Adds the `index`-th packet of the batch; `packet_at` returns earlier ones by index.
    pub fn add<'p>(&mut self, index: usize, packet: &[u8], packet_at: impl Fn(usize) -> &'p [u8]) {
        let Some(segment) = coalescable(packet) else {
            self.order.push(Slot::Packet(index));
            return;
        };
        let payload = &packet[segment.ip_header_len + segment.tcp_header_len..];
        // The latest open item of this flow.
        let candidate = self
            .items
            .iter()
            .rposition(|item| item.segment.key == segment.key);
        if let Some(at) = candidate {
            let fits = {
                let item = &self.items[at];
                !item.closed
                    && item.next_seq == segment.seq
                    && payload.len() <= item.gso_size
                    && item.length + payload.len() <= MAX_PACKET
                    && same_headers(packet_at(item.first), packet, &item.segment, &segment)
            };
            if fits {
                self.append(at, packet_at, packet, &segment);
                return;
            }
        }
        let gso_size = payload.len();
        let closed = segment.flags & TCP_PSH != 0;
        let next_seq = segment
            .seq
            .wrapping_add(u32::try_from(gso_size).unwrap_or(0));
        self.order.push(Slot::Item(self.items.len()));
        self.items.push(Item {
            segment,
            first: index,
            buffer: None,
            length: packet.len(),
            gso_size,
            next_seq,
            closed,
            merged: 0,
        });
    }

    fn append<'p>(
        &mut self,
        at: usize,
        packet_at: impl Fn(usize) -> &'p [u8],
        packet: &[u8],
        segment: &TcpSegment,
    ) {
        let used = self.items.iter().filter(|i| i.buffer.is_some()).count();
        let item = &mut self.items[at];
        let buffer_index = match item.buffer {
            Some(b) => b,
            None => {
                if self.buffers.len() <= used {
                    self.buffers
                        .push(Vec::with_capacity(VNET_HDR_LEN + MAX_PACKET));
                }
                let buffer = &mut self.buffers[used];
                buffer.clear();
                buffer.resize(VNET_HDR_LEN, 0);
                buffer.extend_from_slice(packet_at(item.first));
                item.buffer = Some(used);
                used
            }
        };
        let payload = &packet[segment.ip_header_len + segment.tcp_header_len..];
        let buffer = &mut self.buffers[buffer_index];
        buffer.extend_from_slice(payload);
        item.length += payload.len();
        item.merged += 1;
        item.next_seq = item
            .next_seq
            .wrapping_add(u32::try_from(payload.len()).unwrap_or(0));
        if payload.len() < item.gso_size || segment.flags & TCP_PSH != 0 {
            item.closed = true;
            // The PSH of the last segment carries over to the super-packet.
            let flags_at = VNET_HDR_LEN + item.segment.ip_header_len + 13;
            if let Some(flags) = buffer.get_mut(flags_at) {
                *flags |= segment.flags & TCP_PSH;
            }
        }
    }

    /// The batch's packets in write order; call [`Coalescer::super_packet`] for the merged
    /// ones.
    pub fn finish(&mut self) -> Vec<Coalesced> {
        let mut out = Vec::with_capacity(self.order.len());
        for &slot in &self.order {
            let entry = match slot {
                Slot::Packet(index) => {
                    out.push(Coalesced::Single(index));
                    continue;
                }
                Slot::Item(entry) => entry,
            };
            let Some(item) = self.items.get(entry) else {
                continue;
            };
            match item.buffer {
                None => out.push(Coalesced::Single(item.first)),
                Some(b) => {
                    if let Some(buffer) = self.buffers.get_mut(b) {
                        finish_super_packet(buffer, item);
                    }
                    out.push(Coalesced::Merged(b));
                }
            }
        }
        out
    }

    /// A super-packet [`Coalescer::finish`] named, its `virtio_net_hdr` first.
    pub fn super_packet(&self, index: usize) -> &[u8] {
        self.buffers.get(index).map(Vec::as_slice).unwrap_or(&[])
    }
}

/// Whether the headers of `packet` match those of the item's first packet `first` in all but
/// what differs between segments.
fn same_headers(first: &[u8], packet: &[u8], a: &TcpSegment, b: &TcpSegment) -> bool {
    if a.ip_header_len != b.ip_header_len || a.tcp_header_len != b.tcp_header_len {
        return false;
    }
    let ip_same = if a.key.v6 {
        // Version, traffic class, flow label; next header and hop limit.
        first[..4] == packet[..4] && first[6..8] == packet[6..8]
    } else {
        // Version/IHL, TOS; flags/fragment (DF); TTL and protocol.
        first[..2] == packet[..2] && first[6..10] == packet[6..10]
    };
    let t = a.ip_header_len;
    let (ta, tb) = (&first[t..], &packet[t..]);
    // Acknowledgement number, data offset, window; options (timestamps included), as the
    // kernel's GRO requires. Flags are ACK (and PSH) for both (see `coalescable`).
    ip_same
        && ta[8..13] == tb[8..13]
        && ta[14..16] == tb[14..16]
        && ta[20..a.tcp_header_len] == tb[20..b.tcp_header_len]
        && ta[13] & TCP_PSH == 0
}

/// Lengths, the IPv4 header checksum and the `virtio_net_hdr` of a finished super-packet; the
/// TCP checksum field gets the pseudo-header's sum.
fn finish_super_packet(buffer: &mut [u8], item: &Item) {
    let ip_header_len = item.segment.ip_header_len;
    let v6 = item.segment.key.v6;
    let Some(pkt) = buffer.get_mut(VNET_HDR_LEN..) else {
        return;
    };
    let length = pkt.len();
    if v6 {
        let payload_len = u16::try_from(length - 40).unwrap_or(u16::MAX);
        pkt[4..6].copy_from_slice(&payload_len.to_be_bytes());
    } else {
        let total = u16::try_from(length).unwrap_or(u16::MAX);
        pkt[2..4].copy_from_slice(&total.to_be_bytes());
        pkt[10..12].copy_from_slice(&[0, 0]);
        let sum = checksum(&pkt[..ip_header_len]);
        pkt[10..12].copy_from_slice(&sum.to_be_bytes());
    }
    let tcp_len = length - ip_header_len;
    let (src, dst) = addresses(pkt, v6);
    let pseudo = checksum_fold(pseudo_header_sum(src, dst, IPPROTO_TCP, tcp_len));
    let at = ip_header_len + 16;
    pkt[at..at + 2].copy_from_slice(&pseudo.to_be_bytes());
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: if v6 { GSO_TCPV6 } else { GSO_TCPV4 },
        hdr_len: u16::try_from(ip_header_len + item.segment.tcp_header_len).unwrap_or(0),
        gso_size: u16::try_from(item.gso_size).unwrap_or(0),
        csum_start: u16::try_from(ip_header_len).unwrap_or(0),
        csum_offset: 16,
    };
    hdr.encode(buffer);
}

#[cfg(test)]
mod tests;
