use super::*;

/// An independent checksum: 16-bit words one at a time, carries folded as they come.
fn naive_sum(data: &[u8], mut sum: u32) -> u32 {
    for pair in data.chunks(2) {
        let word = u32::from(pair[0]) << 8 | u32::from(*pair.get(1).unwrap_or(&0));
        sum += word;
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

fn naive_checksum_ok(data: &[u8], initial: u32) -> bool {
    naive_sum(data, initial) == 0xffff
}

/// The TCP checksum of `packet` verifies (pseudo-header included).
fn tcp_checksum_ok(packet: &[u8]) -> bool {
    let v6 = packet[0] >> 4 == 6;
    let (header, src, dst) = if v6 {
        (40, &packet[8..24], &packet[24..40])
    } else {
        (
            usize::from(packet[0] & 0xf) * 4,
            &packet[12..16],
            &packet[16..20],
        )
    };
    let tcp_len = packet.len() - header;
    let mut pseudo = naive_sum(src, 0);
    pseudo = naive_sum(dst, pseudo);
    pseudo = naive_sum(&[0, 6], pseudo);
    pseudo = naive_sum(&u16::try_from(tcp_len).unwrap().to_be_bytes(), pseudo);
    naive_checksum_ok(&packet[header..], pseudo)
}

fn payload_bytes(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

/// A TCP/IPv4 packet 10.0.0.1:1234 -> 10.0.0.2:80, seq 1000, ACK|PSH, with timestamps, its
/// checksums as the kernel leaves them for TSO (zero here: segmentation recomputes them).
fn tcp4(payload: &[u8], flags: u8) -> Vec<u8> {
    let mut p = vec![
        0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ];
    let total = u16::try_from(20 + 32 + payload.len()).unwrap_or(0xffff);
    p[2..4].copy_from_slice(&total.to_be_bytes());
    p.extend_from_slice(&[
        0x04, 0xd2, 0, 80, 0, 0, 0x03, 0xe8, 0, 0, 0, 1, 0x80, flags, 0x01, 0xf5, 0, 0, 0, 0,
        // NOP NOP timestamps
        1, 1, 8, 10, 0, 0, 0, 5, 0, 0, 0, 9,
    ]);
    p.extend_from_slice(payload);
    p
}

fn tcp6(payload: &[u8], flags: u8) -> Vec<u8> {
    let mut p = vec![0x60, 0, 0, 0, 0, 0, 6, 64];
    p.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    p.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    let len = u16::try_from(20 + payload.len()).unwrap();
    p[4..6].copy_from_slice(&len.to_be_bytes());
    p.extend_from_slice(&[
        0x04, 0xd2, 0, 80, 0, 0, 0x03, 0xe8, 0, 0, 0, 1, 0x50, flags, 0x01, 0xf5, 0, 0, 0, 0,
    ]);
    p.extend_from_slice(payload);
    p
}

fn segments_of(packet: &[u8], hdr: &VnetHdr) -> Vec<Vec<u8>> {
    let mut scratch = vec![0u8; 65536];
    let mut out = Vec::new();
    segment(packet, hdr, &mut scratch, |s| out.push(s.to_vec())).unwrap();
    out
}

#[test]
fn the_checksum_of_known_data() {
    // RFC 1071's example: the sum of 0001 f203 f4f5 f6f7 is ddf2.
    assert_eq!(
        checksum_fold(checksum_add(
            &[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7],
            0
        )),
        0xddf2
    );
    // A known IPv4 header (192.168.0.1 -> 192.168.0.199, UDP): its checksum is b861.
    let header = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];
    assert_eq!(checksum(&header), 0xb861);
    // Odd lengths and lengths around the 8-byte chunks agree with the naive sum.
    for len in 0..40 {
        let data = payload_bytes(len + 1000);
        let data = &data[..len + 1000 - 1000 + len];
        assert_eq!(
            u32::from(checksum_fold(checksum_add(data, 0))),
            naive_sum(data, 0),
            "length {}",
            data.len()
        );
    }
}

#[test]
fn the_vnet_header_round_trips() {
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_TCPV4,
        hdr_len: 52,
        gso_size: 1368,
        csum_start: 20,
        csum_offset: 16,
    };
    let mut bytes = [0u8; VNET_HDR_LEN];
    hdr.encode(&mut bytes);
    assert_eq!(VnetHdr::decode(&bytes), Some(hdr));
    assert_eq!(VnetHdr::decode(&bytes[..9]), None);
}

#[test]
fn an_ipv4_super_packet_is_cut_into_valid_segments() {
    let payload = payload_bytes(2500);
    let packet = tcp4(&payload, TCP_ACK | TCP_PSH | TCP_CWR);
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_TCPV4,
        hdr_len: 52,
        gso_size: 1000,
        csum_start: 20,
        csum_offset: 16,
    };
    let segments = segments_of(&packet, &hdr);
    assert_eq!(segments.len(), 3);
    let mut joined = Vec::new();
    for (i, s) in segments.iter().enumerate() {
        let chunk = if i < 2 { 1000 } else { 500 };
        assert_eq!(s.len(), 52 + chunk);
        assert_eq!(usize::from(u16::from_be_bytes([s[2], s[3]])), s.len());
        assert_eq!(
            u16::from_be_bytes([s[4], s[5]]),
            0x1234 + u16::try_from(i).unwrap()
        );
        assert!(naive_checksum_ok(&s[..20], 0), "IP checksum of segment {i}");
        assert!(tcp_checksum_ok(s), "TCP checksum of segment {i}");
        let seq = u32::from_be_bytes([s[24], s[25], s[26], s[27]]);
        assert_eq!(seq, 1000 + 1000 * u32::try_from(i).unwrap());
        let flags = s[33];
        assert_eq!(flags & TCP_PSH != 0, i == 2, "PSH on the last only");
        assert_eq!(flags & TCP_CWR != 0, i == 0, "CWR on the first only");
        assert_eq!(flags & TCP_ACK, TCP_ACK);
        // Options (timestamps) on every segment.
        assert_eq!(&s[40..52], &packet[40..52]);
        joined.extend_from_slice(&s[52..]);
    }
    assert_eq!(joined, payload);
}

#[test]
fn an_ipv6_super_packet_is_cut_into_valid_segments() {
    let payload = payload_bytes(3000);
    let packet = tcp6(&payload, TCP_ACK);
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_TCPV6,
        hdr_len: 60,
        gso_size: 1200,
        csum_start: 40,
        csum_offset: 16,
    };
    let segments = segments_of(&packet, &hdr);
    assert_eq!(segments.len(), 3);
    for s in &segments {
        assert_eq!(usize::from(u16::from_be_bytes([s[4], s[5]])), s.len() - 40);
        assert!(tcp_checksum_ok(s));
    }
    assert_eq!(segments[2].len(), 60 + 600);
}

#[test]
fn malformed_super_packets_are_refused_not_panicked_on() {
    let hdr = VnetHdr {
        gso_type: GSO_TCPV4,
        gso_size: 100,
        ..VnetHdr::default()
    };
    let mut scratch = vec![0u8; 65536];
    let packet = tcp4(&payload_bytes(300), TCP_ACK);
    for cut in 0..60 {
        let _ = segment(&packet[..cut], &hdr, &mut scratch, |_| {});
    }
    let zero = VnetHdr { gso_size: 0, ..hdr };
    assert_eq!(
        segment(&packet, &zero, &mut scratch, |_| {}),
        Err(OffloadError::NotSegmentable)
    );
    let udp = VnetHdr { gso_type: 5, ..hdr };
    assert_eq!(
        segment(&packet, &udp, &mut scratch, |_| {}),
        Err(OffloadError::GsoType(5))
    );
    let v6_as_v4 = tcp6(&payload_bytes(300), TCP_ACK);
    assert_eq!(
        segment(&v6_as_v4, &hdr, &mut scratch, |_| {}),
        Err(OffloadError::NotSegmentable)
    );
}

#[test]
fn a_partial_checksum_is_completed() {
    // The kernel leaves the pseudo-header's sum in the field (not complemented).
    let mut packet = tcp4(&payload_bytes(333), TCP_ACK | TCP_PSH);
    let tcp_len = packet.len() - 20;
    let pseudo = checksum_fold(pseudo_header_sum(
        &packet[12..16],
        &packet[16..20],
        6,
        tcp_len,
    ));
    packet[36..38].copy_from_slice(&pseudo.to_be_bytes());
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        csum_start: 20,
        csum_offset: 16,
        ..VnetHdr::default()
    };
    complete_checksum(&mut packet, &hdr).unwrap();
    assert!(tcp_checksum_ok(&packet));
    let outside = VnetHdr {
        csum_start: 2000,
        ..hdr
    };
    assert_eq!(
        complete_checksum(&mut packet, &outside),
        Err(OffloadError::ChecksumPosition)
    );
}

fn coalesce(packets: &[Vec<u8>]) -> (Vec<Coalesced>, Coalescer) {
    let mut coalescer = Coalescer::default();
    coalescer.clear();
    for (i, p) in packets.iter().enumerate() {
        coalescer.add(i, p, |j| packets[j].as_slice());
    }
    let out = coalescer.finish();
    (out, coalescer)
}

/// What the kernel does with a super-packet written to the tun device: completes the checksum
/// and segments it; here, only the completion, over the whole super-packet.
fn kernel_view(buffer: &[u8]) -> (VnetHdr, Vec<u8>) {
    let hdr = VnetHdr::decode(buffer).unwrap();
    let mut packet = buffer[VNET_HDR_LEN..].to_vec();
    complete_checksum(&mut packet, &hdr).unwrap();
    (hdr, packet)
}

#[test]
fn segments_coalesce_back_into_the_super_packet() {
    for v6 in [false, true] {
        let payload = payload_bytes(4100);
        let packet = if v6 {
            tcp6(&payload, TCP_ACK | TCP_PSH)
        } else {
            tcp4(&payload, TCP_ACK | TCP_PSH)
        };
        let hdr = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: if v6 { GSO_TCPV6 } else { GSO_TCPV4 },
            gso_size: 1000,
            csum_start: if v6 { 40 } else { 20 },
            csum_offset: 16,
            hdr_len: 0,
        };
        let segments = segments_of(&packet, &hdr);
        assert_eq!(segments.len(), 5);
        let (out, coalescer) = coalesce(&segments);
        assert_eq!(out, vec![Coalesced::Merged(0)]);
        let (got, merged) = kernel_view(coalescer.super_packet(0));
        assert_eq!(got.gso_type, hdr.gso_type);
        assert_eq!(got.gso_size, 1000);
        assert_eq!(got.flags, F_NEEDS_CSUM);
        assert_eq!(merged.len(), packet.len());
        assert!(tcp_checksum_ok(&merged), "v6 {v6}");
        if !v6 {
            assert!(naive_checksum_ok(&merged[..20], 0));
            assert_eq!(
                usize::from(u16::from_be_bytes([merged[2], merged[3]])),
                merged.len()
            );
        }
        let headers = if v6 { 60 } else { 52 };
        assert_eq!(&merged[headers..], payload.as_slice());
        // PSH (the last segment's) carried over.
        assert_ne!(merged[headers - if v6 { 20 } else { 32 } + 13] & TCP_PSH, 0);
    }
}

#[test]
fn what_cannot_be_merged_stays_apart_and_in_order() {
    let hdr = VnetHdr {
        gso_type: GSO_TCPV4,
        gso_size: 500,
        ..VnetHdr::default()
    };
    let segments = segments_of(&tcp4(&payload_bytes(2000), TCP_ACK), &hdr);
    assert_eq!(segments.len(), 4);
    // A gap: the third segment is missing.
    let gap = vec![
        segments[0].clone(),
        segments[1].clone(),
        segments[3].clone(),
    ];
    let (out, _) = coalesce(&gap);
    assert_eq!(out, vec![Coalesced::Merged(0), Coalesced::Single(2)]);
    // A short segment ends a super-packet: what follows starts another.
    let short = segments_of(&tcp4(&payload_bytes(700), TCP_ACK), &hdr);
    let (out, _) = coalesce(&[short[1].clone(), segments[0].clone()]);
    assert_eq!(out, vec![Coalesced::Single(0), Coalesced::Single(1)]);
    // Not TCP, a SYN, a lone segment: as they are.
    let mut udp = tcp4(&[1, 2, 3], TCP_ACK);
    udp[9] = 17;
    let syn = tcp4(&[], 0x02);
    let (out, _) = coalesce(&[udp, syn, segments[0].clone()]);
    assert_eq!(
        out,
        vec![
            Coalesced::Single(0),
            Coalesced::Single(1),
            Coalesced::Single(2)
        ]
    );
    // Another flow in between: each flow merged on its own, in order.
    let mut other: Vec<Vec<u8>> = segments.clone();
    for s in &mut other {
        s[23] = 81; // destination port
    }
    let mixed = vec![
        segments[0].clone(),
        other[0].clone(),
        segments[1].clone(),
        other[1].clone(),
    ];
    let (out, coalescer) = coalesce(&mixed);
    assert_eq!(out, vec![Coalesced::Merged(0), Coalesced::Merged(1)]);
    assert_eq!(coalescer.super_packet(0).len(), VNET_HDR_LEN + 52 + 1000);
    // Different timestamps (another super-packet's): not merged.
    let mut later = segments[1].clone();
    later[47] = 6;
    let (out, _) = coalesce(&[segments[0].clone(), later]);
    assert_eq!(out, vec![Coalesced::Single(0), Coalesced::Single(1)]);
}
