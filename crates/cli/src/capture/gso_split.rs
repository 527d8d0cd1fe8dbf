//! Same-host soft-RoCE sends runs of equal-size packets as one `UDP_SEGMENT` send (see the
//! roce driver's `gso.rs`), and `lo` carries such a run as one large frame: the capture sees
//! it before any segmentation. [`split`] turns that frame back into the datagrams the kernel
//! delivers (and a segmenting NIC would put on a wire): the segment size is the one for which
//! every segment carries the right ICRC, IPv4 segment `k` has the first one's Identification
//! plus `k`, and every length and checksum is the segment's own.

use softrdma_wire::roce::icrc::icrc_of_ip_packet;
use softrdma_wire::roce::RoceHeaders;

const ETH: usize = 14;
const UDP: usize = 8;
const ICRC: usize = 4;
/// Path MTUs (IB 256..4096): a run's first packet most often carries one.
const MTUS: [usize; 5] = [4096, 2048, 1024, 512, 256];
/// The largest datagram tried when the first packet is not a full MTU.
const MAX_SEGMENT: usize = 9216;

/// The datagrams of a captured `UDP_SEGMENT` run of RoCEv2 packets, as Ethernet frames, or
/// None if `frame` is not one (a single datagram, or not RoCE).
pub(super) fn split(frame: &[u8]) -> Option<Vec<Vec<u8>>> {
    let ip = frame.get(ETH..)?;
    let (l4, ip_len) = match ip.first()? >> 4 {
        4 if ip.get(9) == Some(&17) => (
            usize::from(ip[0] & 0x0f) * 4,
            usize::from(u16::from_be_bytes([ip[2], ip[3]])),
        ),
        6 if ip.get(6) == Some(&17) => (40, 40 + usize::from(u16::from_be_bytes([ip[4], ip[5]]))),
        _ => return None,
    };
    let payload = ip.get(l4 + UDP..ip_len)?;
    let (_, hdr) = RoceHeaders::parse(payload).ok()?;
    let mtu_sizes = MTUS.iter().map(|m| hdr + m + ICRC);
    let any_sizes = (hdr + ICRC..=MAX_SEGMENT).step_by(4);
    mtu_sizes
        .chain(any_sizes)
        .filter(|&s| s < payload.len())
        .find_map(|s| segments(frame, l4, ip_len, s))
}

/// The run cut at `size` bytes of UDP payload, if every segment's ICRC is right.
fn segments(frame: &[u8], l4: usize, ip_len: usize, size: usize) -> Option<Vec<Vec<u8>>> {
    let ip = &frame[ETH..ETH + ip_len];
    let payload = &ip[l4 + UDP..];
    let v4 = ip[0] >> 4 == 4;
    let first_id = u16::from_be_bytes([ip[4], ip[5]]);
    let mut out = Vec::with_capacity(payload.len() / size + 1);
    for (k, chunk) in payload.chunks(size).enumerate() {
        let mut f = Vec::with_capacity(ETH + l4 + UDP + chunk.len());
        f.extend_from_slice(&frame[..ETH + l4 + UDP]);
        f.extend_from_slice(chunk);
        let seg = &mut f[ETH..];
        let udp_len = (UDP + chunk.len()) as u16;
        if v4 {
            seg[2..4].copy_from_slice(&((l4 + UDP + chunk.len()) as u16).to_be_bytes());
            seg[4..6].copy_from_slice(&first_id.wrapping_add(k as u16).to_be_bytes());
            let sum = etherparse::Ipv4HeaderSlice::from_slice(&seg[..l4])
                .ok()?
                .to_header()
                .calc_header_checksum();
            seg[10..12].copy_from_slice(&sum.to_be_bytes());
        } else {
            seg[4..6].copy_from_slice(&udp_len.to_be_bytes());
        }
        seg[l4 + 4..l4 + 6].copy_from_slice(&udp_len.to_be_bytes());
        let (carried, computed) = icrc_of_ip_packet(seg).ok()?;
        if carried != computed {
            return None;
        }
        super::udp_checksum(seg, l4);
        out.push(f);
    }
    (out.len() > 1).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_wire::roce::icrc::{icrc, icrc_bytes, IcrcIp};
    use std::net::Ipv4Addr;

    const LO: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);

    /// RoCE packet `k` of a run: a SEND_MIDDLE (0x01) of `len` payload bytes, its ICRC for
    /// IPv4 ID `k`.
    fn packet(k: u16, len: usize) -> Vec<u8> {
        let mut t = vec![0x01, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, k as u8];
        t.extend(std::iter::repeat_n(k as u8, len));
        let ip = IcrcIp::V4 {
            src: LO,
            dst: LO,
            id: k,
            dont_fragment: true,
        };
        let crc = icrc(&ip, 40000, 50000, &t);
        t.extend_from_slice(&icrc_bytes(crc));
        t
    }

    /// One frame carrying `packets` back to back, as `lo` shows a UDP_SEGMENT send.
    fn run_frame(packets: &[Vec<u8>]) -> Vec<u8> {
        let payload: Vec<u8> = packets.concat();
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x08, 0x00]);
        let total = (20 + UDP + payload.len()) as u16;
        f.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0]);
        f[16..18].copy_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&LO.octets());
        f.extend_from_slice(&LO.octets());
        f.extend_from_slice(&40000u16.to_be_bytes());
        f.extend_from_slice(&50000u16.to_be_bytes());
        f.extend_from_slice(&((UDP + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&payload);
        f
    }

    #[test]
    fn a_run_splits_into_datagrams_with_their_ids_and_icrcs() {
        // Three full 1024-byte packets and a shorter last one.
        let packets = [packet(0, 1024), packet(1, 1024), packet(2, 1024), packet(3, 100)];
        let segs = split(&run_frame(&packets)).expect("a run of RoCE packets");
        assert_eq!(segs.len(), 4);
        for (k, s) in segs.iter().enumerate() {
            let ip = &s[ETH..];
            assert_eq!(u16::from_be_bytes([ip[4], ip[5]]), k as u16, "IPv4 ID");
            assert_eq!(usize::from(u16::from_be_bytes([ip[2], ip[3]])), ip.len());
            let h = etherparse::Ipv4HeaderSlice::from_slice(ip).unwrap().to_header();
            assert_eq!(h.header_checksum, h.calc_header_checksum(), "a valid header checksum");
            let (carried, computed) = icrc_of_ip_packet(ip).unwrap();
            assert_eq!(carried, computed);
            assert_eq!(&ip[28..], &packets[k][..]);
        }
    }

    #[test]
    fn runs_of_small_packets_split_and_anything_else_does_not() {
        let packets: Vec<Vec<u8>> = (0..5).map(|k| packet(k, 64)).collect();
        assert_eq!(split(&run_frame(&packets)).map(|s| s.len()), Some(5));
        // One datagram alone is not a run.
        assert!(split(&run_frame(&packets[..1])).is_none());
        // Packets whose ICRCs assume ID 0 each (not a segmented run) do not split.
        let mut wrong = packets.clone();
        wrong[1] = packet(0, 64);
        assert!(split(&run_frame(&wrong)).is_none());
        assert!(split(&[0u8; 10]).is_none());
    }
}
