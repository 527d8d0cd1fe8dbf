//! `softrdma capture -w FILE [--seconds N] [-- CMD ARGS...]`: records this host's softrdma
//! traffic on `lo` in a pcapng file that Wireshark decodes.
//!
//! soft-iWARP on `lo` is plain TCP, which Wireshark's MPA dissector finds by itself. Same-host
//! soft-RoCE is not: a datagram for a process on this host goes straight to that process's
//! own UDP port (see the README's "soft-RoCEv2"), not to 4791, so Wireshark sees unknown UDP.
//! The capture runs `dumpcap` on `lo` (root, or a dumpcap with `cap_net_raw`), then rewrites
//! every UDP datagram whose ICRC proves it a RoCEv2 packet *as sent* (checked with its real
//! ports) to destination port 4791, with the ICRC and UDP checksum recomputed for the
//! rewritten headers. A datagram whose ICRC does not verify is left as it was, so a wrong
//! ICRC stays visible. The canary datagrams that bracket the capture are left out.

mod gso_split;

use std::io::{BufReader, BufWriter, Read};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use pcap_file::pcapng::{Block, PcapNgReader, PcapNgWriter};
use softrdma_wire::roce::icrc::{icrc_bytes, icrc_of_ip_packet};

/// The RoCEv2 UDP port.
const ROCE_PORT: u16 = 4791;

/// Options of `softrdma capture`.
#[derive(Args)]
pub struct CaptureArgs {
    /// The pcapng file to write.
    #[arg(short = 'w', long = "write")]
    file: PathBuf,
    /// Without a command: capture for this many seconds.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// The interface to capture on.
    #[arg(short, long, default_value = "lo")]
    interface: String,
    /// A command to run while capturing (the capture ends when it exits; its status is ours).
    #[arg(last = true)]
    command: Vec<String>,
}

/// Captures, runs the command (or waits), and writes the rewritten file.
pub fn run(args: &CaptureArgs) -> Result<std::process::ExitCode, Box<dyn std::error::Error>> {
    let raw = args.file.with_extension("raw.pcapng");
    let canary = UdpSocket::bind("127.0.0.1:0")?;
    let tag = format!("softrdma-capture-canary-{}", std::process::id());
    let mut dumpcap = Command::new("dumpcap")
        .args(["-q", "-i", &args.interface, "-f", "udp or tcp", "-w"])
        .arg(&raw)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start dumpcap ({e}): install tshark (Debian: wireshark-common)"))?;
    let live = wait_for_canary(&canary, &tag, &raw, &mut dumpcap, 1);
    let status = match live {
        Ok(()) => run_command(args),
        Err(e) => Err(e),
    };
    let closed = wait_for_canary(&canary, &tag, &raw, &mut dumpcap, 2);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dumpcap.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let _ = dumpcap.wait();
    let status = status?;
    closed?;
    let (packets, rewritten) = rewrite(&raw, &args.file, tag.as_bytes())?;
    let _ = std::fs::remove_file(&raw);
    eprintln!(
        "softrdma capture: {packets} packets in {}; {rewritten} same-host RoCE datagrams readdressed to UDP {ROCE_PORT}",
        args.file.display()
    );
    Ok(status)
}

fn run_command(args: &CaptureArgs) -> Result<std::process::ExitCode, Box<dyn std::error::Error>> {
    let Some((cmd, rest)) = args.command.split_first() else {
        std::thread::sleep(Duration::from_secs(args.seconds));
        return Ok(std::process::ExitCode::SUCCESS);
    };
    let status = Command::new(cmd)
        .args(rest)
        .status()
        .map_err(|e| format!("cannot run {cmd}: {e}"))?;
    Ok(std::process::ExitCode::from(
        status.code().unwrap_or(1).clamp(0, 255) as u8
    ))
}

/// Sends canary `n` until it shows up in the capture file: dumpcap says "Capturing on" before
/// it captures, and writes packets a little after they pass.
fn wait_for_canary(
    sock: &UdpSocket,
    tag: &str,
    raw: &Path,
    dumpcap: &mut std::process::Child,
    n: u32,
) -> Result<(), Box<dyn std::error::Error>> {
    let payload = format!("{tag}-{n}");
    let target = sock.local_addr()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        sock.send_to(payload.as_bytes(), target)?;
        if file_contains(raw, payload.as_bytes()) {
            return Ok(());
        }
        if let Some(status) = dumpcap.try_wait()? {
            let mut err = String::new();
            if let Some(mut e) = dumpcap.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return Err(format!(
                "dumpcap exited ({status}): {} (capturing needs root or a dumpcap with cap_net_raw)",
                err.trim()
            )
            .into());
        }
        if Instant::now() > deadline {
            return Err("the capture did not see its canary datagram within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn file_contains(path: &Path, needle: &[u8]) -> bool {
    std::fs::read(path).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle))
}

/// Copies `raw` to `out` without the canaries, readdressing same-host RoCE datagrams.
/// Returns (packets written, datagrams rewritten).
fn rewrite(raw: &Path, out: &Path, canary: &[u8]) -> Result<(usize, usize), Box<dyn std::error::Error>> {
    let mut reader = PcapNgReader::new(BufReader::new(std::fs::File::open(raw)?))?;
    let mut writer =
        PcapNgWriter::with_section_header(BufWriter::new(std::fs::File::create(out)?), reader.section().clone())?;
    let (mut packets, mut rewritten) = (0, 0);
    while let Some(block) = reader.next_block() {
        let block = block?;
        match block {
            Block::SectionHeader(_) => {}
            Block::EnhancedPacket(epb) => {
                if epb.data.windows(canary.len()).any(|w| w == canary) {
                    continue;
                }
                // A UDP_SEGMENT run (one frame on lo) goes in as the datagrams it carries.
                let frames = match readdress(&epb.data) {
                    Some(new) => vec![(new, true)],
                    None => match gso_split::split(&epb.data) {
                        Some(segs) => segs
                            .into_iter()
                            .map(|s| match readdress(&s) {
                                Some(new) => (new, true),
                                None => (s, false),
                            })
                            .collect(),
                        None => vec![(epb.data.to_vec(), false)],
                    },
                };
                for (data, readdressed) in frames {
                    let mut one = epb.clone();
                    one.original_len = data.len() as u32;
                    one.data = data.into();
                    rewritten += usize::from(readdressed);
                    packets += 1;
                    writer.write_block(&Block::EnhancedPacket(one))?;
                }
            }
            other => {
                writer.write_block(&other)?;
            }
        }
    }
    Ok((packets, rewritten))
}

/// An Ethernet frame carrying a RoCEv2 datagram to a port other than 4791, whose ICRC is right
/// for the headers it was sent with: the same frame to port 4791 with ICRC and UDP checksum
/// recomputed. None for anything else.
fn readdress(frame: &[u8]) -> Option<Vec<u8>> {
    const ETH: usize = 14;
    let ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    if ethertype != 0x0800 && ethertype != 0x86dd {
        return None;
    }
    let ip = frame.get(ETH..)?;
    let (carried, computed) = icrc_of_ip_packet(ip).ok()?;
    if carried != computed {
        return None;
    }
    let l4 = match ip[0] >> 4 {
        4 => usize::from(ip[0] & 0x0f) * 4,
        _ => 40,
    };
    let dst_port = u16::from_be_bytes([*ip.get(l4 + 2)?, *ip.get(l4 + 3)?]);
    if dst_port == ROCE_PORT {
        return None;
    }
    let mut out = frame.to_vec();
    let udp = ETH + l4;
    out[udp + 2..udp + 4].copy_from_slice(&ROCE_PORT.to_be_bytes());
    let ip_len = match ip[0] >> 4 {
        4 => usize::from(u16::from_be_bytes([ip[2], ip[3]])),
        _ => 40 + usize::from(u16::from_be_bytes([ip[4], ip[5]])),
    };
    let end = ETH + ip_len;
    let (_, icrc) = icrc_of_ip_packet(&out[ETH..end]).ok()?;
    out[end - 4..end].copy_from_slice(&icrc_bytes(icrc));
    udp_checksum(&mut out[ETH..end], l4);
    Some(out)
}

/// Recomputes the UDP checksum of the IP packet `ip` whose UDP header starts at `l4`
/// (etherparse, over the IPv4 or IPv6 pseudo header). Leaves it alone if the header is short.
pub(super) fn udp_checksum(ip: &mut [u8], l4: usize) {
    let Ok((udp, payload)) = etherparse::UdpHeader::from_slice(&ip[l4..]) else {
        return;
    };
    let sum = if ip[0] >> 4 == 4 {
        let addr = |at: usize| -> [u8; 4] { ip[at..at + 4].try_into().unwrap_or_default() };
        udp.calc_checksum_ipv4_raw(addr(12), addr(16), payload)
    } else {
        let addr = |at: usize| -> [u8; 16] { ip[at..at + 16].try_into().unwrap_or_default() };
        udp.calc_checksum_ipv6_raw(addr(8), addr(24), payload)
    };
    if let Ok(c) = sum {
        ip[l4 + 6..l4 + 8].copy_from_slice(&c.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_wire::roce::icrc::IcrcIp;
    use std::net::Ipv4Addr;

    /// A same-host RoCE datagram (to port 50000) in an Ethernet frame, ICRC as sent.
    fn frame(dst_port: u16, corrupt: bool) -> Vec<u8> {
        let (src, dst) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 1));
        // BTH: SEND_ONLY (0x04) to QP 0x11, PSN 5, then 4 bytes of payload.
        let mut transport = vec![0x04, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 5, 1, 2, 3, 4];
        let ip = IcrcIp::v4_df(src, dst);
        let icrc = softrdma_wire::roce::icrc::icrc(&ip, 49999, dst_port, &transport);
        transport.extend_from_slice(&icrc_bytes(icrc ^ u32::from(corrupt)));
        let udp_len = 8 + transport.len();
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x08, 0x00]);
        let total = (20 + udp_len) as u16;
        f.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0]);
        f[14 + 2..14 + 4].copy_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&src.octets());
        f.extend_from_slice(&dst.octets());
        f.extend_from_slice(&49999u16.to_be_bytes());
        f.extend_from_slice(&dst_port.to_be_bytes());
        f.extend_from_slice(&(udp_len as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&transport);
        f
    }

    #[test]
    fn readdresses_only_roce_with_a_good_icrc() {
        let f = frame(50000, false);
        let g = readdress(&f).expect("a good same-host datagram is readdressed");
        assert_eq!(&g[36..38], &ROCE_PORT.to_be_bytes());
        let (carried, computed) = icrc_of_ip_packet(&g[14..]).unwrap();
        assert_eq!(carried, computed, "the ICRC fits the new port");
        assert_ne!(&g[40..42], &[0, 0], "UDP checksum set");
        // The pseudo header, UDP header and payload sum to 0xffff with a right checksum.
        let mut sum: u32 = 0;
        let udp = &g[34..];
        let mut add = |b: &[u8]| {
            for c in b.chunks(2) {
                sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
            }
        };
        add(&g[26..34]);
        add(&[0, 17]);
        add(&(udp.len() as u16).to_be_bytes());
        add(udp);
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff, "the UDP checksum verifies");
        assert!(readdress(&frame(50000, true)).is_none(), "a bad ICRC stays as it was");
        assert!(readdress(&frame(ROCE_PORT, false)).is_none(), "already on 4791");
        assert!(readdress(&f[..30]).is_none());
    }
}
