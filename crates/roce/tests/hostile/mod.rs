//! The raw RoCE peer of `hostile_peer.rs`: a plain UDP socket on 127.0.0.1 that builds
//! datagrams with the `softrdma-wire` encoders and a correct (or deliberately wrong) ICRC, and
//! decodes what comes back, both the victim's direct answers and the MADs another softrdma
//! process (or this one) forwards to it with the driver's `SRF2` header.
//!
//! Its port `P` doubles as a QPN home port: a victim QP connected (RTR) to `make_qpn(P, i)`
//! sends its ACKs and NAKs straight here (same-host delivery goes to the owner's home port),
//! and a CM communication ID with low 16 bits `P` gets its replies forwarded here.
//!
//! Idle victim QPs probe the peer they are connected to (keepalive: a duplicate zero-length
//! RDMA WRITE). The peer answers those like any IBTA responder, with an ACK, for the victims
//! registered with [`RawPeer::answer_probes`], and keeps them out of what `recv` returns.

#![allow(dead_code)]

use softrdma_wire::ibcm::{CmMad, MAD_LEN};
use softrdma_wire::roce::*;
use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The driver's forwarding header: magic, family, source IP/port, destination IP/port, hop
/// limit, traffic class.
const FORWARD_MAGIC: &[u8; 4] = b"SRF2";
const FORWARD_HDR_LEN: usize = 4 + 1 + 16 + 2 + 16 + 2 + 1 + 1;

/// One datagram the peer received, decoded.
#[derive(Debug, Clone)]
pub struct Received {
    /// The IB transport packet (ICRC verified and stripped).
    pub transport: Vec<u8>,
    /// It came with a forwarding header (a MAD routed here by communication ID).
    pub forwarded: bool,
    /// The UDP source of the original datagram.
    pub src: SocketAddrV4,
}

impl Received {
    /// The parsed packet.
    pub fn packet(&self) -> RocePacket<'_> {
        RocePacket::parse(&self.transport).expect("the victim sent a packet the wire parser accepts")
    }

    /// The AETH kind, for ACKs.
    pub fn aeth(&self) -> Option<AethKind> {
        self.packet().headers.aeth.map(|a| a.kind())
    }

    /// The CM MAD of a UD SEND to QP1.
    pub fn mad(&self) -> Option<CmMad> {
        let p = self.packet();
        if p.headers.bth.opcode != RoceOpcode::UdSendOnly || p.headers.bth.dest_qp != 1 {
            return None;
        }
        CmMad::parse(p.payload).ok()
    }
}

/// The attacker's socket.
pub struct RawPeer {
    /// The socket (127.0.0.1 or another loopback address).
    pub sock: UdpSocket,
    /// Its port: also the home port of the QPNs this peer impersonates.
    pub port: u16,
    /// Its address.
    pub ip: Ipv4Addr,
    psn: u32,
    /// Keepalive probes to answer: this peer's QPN → the victim QPN connected to it.
    probed: Mutex<HashMap<u32, u32>>,
}

impl RawPeer {
    /// A peer on `ip` (an address of `lo`), sending like the driver does: unconnected with
    /// `IP_PMTUDISC_DO`, so the kernel writes IPv4 ID 0 and DF, which the ICRC covers.
    pub fn new(ip: Ipv4Addr) -> RawPeer {
        let sock = UdpSocket::bind(SocketAddrV4::new(ip, 0)).unwrap();
        let v: libc::c_int = libc::IP_PMTUDISC_DO;
        // SAFETY: setsockopt reads size_of::<c_int>() bytes from a live local; the fd is open.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "IP_MTU_DISCOVER: {}", std::io::Error::last_os_error());
        let port = sock.local_addr().unwrap().port();
        RawPeer {
            sock,
            port,
            ip,
            psn: 0,
            probed: Mutex::new(HashMap::new()),
        }
    }

    /// Marks the peer's port as a softrdma home port (the abstract socket the driver's
    /// `forward` module looks for), as a softrdma process on this host would: MADs routed by a
    /// communication ID naming this port are then forwarded here. Hold the result.
    pub fn mark_home(&self) -> UnixDatagram {
        let name = format!("softrdma-rxe-home-{}", self.port);
        UnixDatagram::bind_addr(&UnixAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap()
    }

    /// The QPN `make_qpn(self.port, index)`: the victim's `dest_qp_num`.
    pub fn qpn(&self, index: u8) -> u32 {
        softrdma_roce::driver::make_qpn(self.port, index).expect("a usable QPN")
    }

    /// A communication ID whose replies are forwarded to this peer.
    pub fn comm_id(&self, k: u16) -> u32 {
        (u32::from(k.max(1)) << 16) | u32::from(self.port)
    }

    /// The ICRC of `transport` sent from this socket to `127.0.0.1:dst_port`.
    pub fn icrc_to(&self, dst_port: u16, transport: &[u8]) -> [u8; ICRC_LEN] {
        let ip = IcrcIp::v4_df(self.ip, Ipv4Addr::LOCALHOST);
        icrc_bytes(icrc(&ip, self.port, dst_port, transport))
    }

    /// Sends `transport` + ICRC (flipped when `bad_icrc`) to `127.0.0.1:dst_port`.
    pub fn send(&self, dst_port: u16, transport: &[u8], bad_icrc: bool) {
        let mut crc = self.icrc_to(dst_port, transport);
        if bad_icrc {
            crc[0] ^= 0x5a;
        }
        let mut d = transport.to_vec();
        d.extend_from_slice(&crc);
        self.sock
            .send_to(&d, SocketAddrV4::new(Ipv4Addr::LOCALHOST, dst_port))
            .unwrap();
    }

    /// Sends raw bytes (no ICRC added).
    pub fn send_raw(&self, dst_port: u16, bytes: &[u8]) {
        self.sock
            .send_to(bytes, SocketAddrV4::new(Ipv4Addr::LOCALHOST, dst_port))
            .unwrap();
    }

    /// A CM MAD (or any payload) to QP1 as a UD SEND_ONLY with `qkey`, to `dst_port`.
    pub fn send_mad(&mut self, dst_port: u16, payload: &[u8], qkey: u32, bad_icrc: bool) {
        let mut bth = Bth::new(RoceOpcode::UdSendOnly, 1, self.psn);
        self.psn = (self.psn + 1) & PSN_MASK;
        bth.mig_req = true;
        let mut h = RoceHeaders::new(bth);
        h.deth = Some(Deth { qkey, src_qp: 1 });
        let mut t = Vec::new();
        h.emit(payload, &mut t);
        self.send(dst_port, &t, bad_icrc);
    }

    /// The next datagram within `wait`, ICRC checked (a bad ICRC fails the test: the victim
    /// must always send valid ones).
    pub fn recv(&self, wait: Duration) -> Option<Received> {
        let until = Instant::now() + wait;
        let mut buf = vec![0u8; 16384];
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.sock.set_read_timeout(Some(left)).unwrap();
            let (n, from) = match self.sock.recv_from(&mut buf) {
                Ok(x) => x,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return None,
                Err(e) => panic!("raw peer recv: {e}"),
            };
            let SocketAddr::V4(from) = from else { continue };
            let d = &buf[..n];
            let (src, dst_ip, dst_port, dgram, forwarded) = if d.len() >= FORWARD_HDR_LEN && &d[..4] == FORWARD_MAGIC {
                let ip4 = |b: &[u8]| Ipv4Addr::new(b[12], b[13], b[14], b[15]);
                let src = SocketAddrV4::new(ip4(&d[5..21]), u16::from_be_bytes([d[21], d[22]]));
                let dst_port = u16::from_be_bytes([d[39], d[40]]);
                (src, ip4(&d[23..39]), dst_port, &d[FORWARD_HDR_LEN..], true)
            } else {
                (from, self.ip, self.port, d, false)
            };
            let ip = IcrcIp::v4_df(*src.ip(), dst_ip);
            let transport = match check_icrc(&ip, src.port(), dst_port, dgram) {
                Ok(t) => t.to_vec(),
                Err(e) => panic!("datagram from {src} (forwarded {forwarded}) with a bad ICRC: {e}"),
            };
            if !forwarded && self.answer_probe(&transport, src) {
                continue;
            }
            return Some(Received {
                transport,
                forwarded,
                src,
            });
        }
    }

    /// Answers keepalive probes that victim QP `victim` sends to this peer's QPN `mine`.
    pub fn answer_probes(&self, mine: u32, victim: u32) {
        self.probed.lock().unwrap().insert(mine, victim);
    }

    /// If `transport` is a keepalive probe for a registered QPN, ACKs it and says so.
    fn answer_probe(&self, transport: &[u8], src: SocketAddrV4) -> bool {
        let Ok(p) = RocePacket::parse(transport) else {
            return false;
        };
        let h = &p.headers;
        let probe =
            h.bth.opcode == RoceOpcode::RcWriteOnly && p.payload.is_empty() && h.reth.is_some_and(|r| r.dma_len == 0);
        let Some(victim) = self
            .probed
            .lock()
            .unwrap()
            .get(&h.bth.dest_qp)
            .copied()
            .filter(|_| probe)
        else {
            return false;
        };
        let mut ack = RoceHeaders::new(Bth::new(RoceOpcode::RcAck, victim, h.bth.psn));
        ack.aeth = Some(Aeth::ack(0, AETH_CREDITS_INVALID));
        let mut t = Vec::new();
        ack.emit(&[], &mut t);
        self.send(src.port(), &t, false);
        true
    }

    /// Everything that arrives within `wait`.
    pub fn recv_all(&self, wait: Duration) -> Vec<Received> {
        let until = Instant::now() + wait;
        let mut out = Vec::new();
        while let Some(r) = self.recv(until.saturating_duration_since(Instant::now())) {
            out.push(r);
        }
        out
    }

    /// Drops whatever is queued.
    pub fn drain(&self) {
        let _ = self.recv_all(Duration::from_millis(50));
    }
}

/// An RC request packet (BTH .. pad) to `dest` at `psn` with AckReq, the RETH / AtomicETH /
/// IETH the opcode needs taken from `reth` (va, rkey, dma_len).
pub fn rc_packet(op: RoceOpcode, dest: u32, psn: u32, reth: Option<(u64, u32, u32)>, payload: &[u8]) -> Vec<u8> {
    let mut bth = Bth::new(op, dest, psn);
    bth.ack_req = true;
    let mut h = RoceHeaders::new(bth);
    let want = op.headers();
    let (va, rkey, dma_len) = reth.unwrap_or((0, 0, payload.len() as u32));
    h.reth = want.reth.then_some(Reth { va, rkey, dma_len });
    h.atomic = want.atomic_eth.then_some(AtomicEth {
        va,
        rkey,
        swap_add: 1,
        compare: 0,
    });
    h.imm = want.immdt.then_some(0x0bad_cafe);
    h.ieth = want.ieth.then_some(rkey);
    let mut out = Vec::new();
    h.emit(payload, &mut out);
    out
}

/// A UD SEND_ONLY to `dest` with `qkey`.
pub fn ud_packet(dest: u32, qkey: u32, src_qp: u32, payload: &[u8]) -> Vec<u8> {
    let mut h = RoceHeaders::new(Bth::new(RoceOpcode::UdSendOnly, dest, 0));
    h.deth = Some(Deth { qkey, src_qp });
    let mut out = Vec::new();
    h.emit(payload, &mut out);
    out
}

/// A 256-byte MAD (or a truncated one: `len` < 256).
pub fn mad_bytes(m: &CmMad, len: usize) -> Vec<u8> {
    let full = m.emit();
    full[..len.min(MAD_LEN)].to_vec()
}
