//! Work requests and work completions, with the numeric values of rdma-core's verbs.h so the
//! C ABI maps them without translation tables.

/// Memory and QP access flags (`enum ibv_access_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Access(pub u32);

impl Access {
    /// IBV_ACCESS_LOCAL_WRITE.
    pub const LOCAL_WRITE: Access = Access(1);
    /// IBV_ACCESS_REMOTE_WRITE.
    pub const REMOTE_WRITE: Access = Access(2);
    /// IBV_ACCESS_REMOTE_READ.
    pub const REMOTE_READ: Access = Access(4);
    /// IBV_ACCESS_REMOTE_ATOMIC.
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// IBV_ACCESS_MW_BIND.
    pub const MW_BIND: Access = Access(16);
    /// Flags that only tune performance; accepted and ignored (RELAXED_ORDERING and the optional range).
    pub const OPTIONAL_MASK: u32 = 0x3ff0_0000;
    /// Every flag softrdma understands.
    pub const KNOWN_MASK: u32 = 0x1f | 0x20 | 0x40 | 0x80 | Access::OPTIONAL_MASK;

    /// True if every bit of `other` is set.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = [
            (1, "LOCAL_WRITE"),
            (2, "REMOTE_WRITE"),
            (4, "REMOTE_READ"),
            (8, "REMOTE_ATOMIC"),
            (16, "MW_BIND"),
        ];
        let parts: Vec<&str> = names.iter().filter(|(b, _)| self.0 & b != 0).map(|(_, n)| *n).collect();
        if parts.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&parts.join("|"))
        }
    }
}

/// A scatter/gather element (`struct ibv_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Start address (inside the MR named by `lkey`).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the MR.
    pub lkey: u32,
}

/// Send work request opcodes (`enum ibv_wr_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum WrOpcode {
    /// RDMA WRITE.
    RdmaWrite = 0,
    /// RDMA WRITE with immediate (RoCE only).
    RdmaWriteWithImm = 1,
    /// SEND.
    Send = 2,
    /// SEND with immediate (RoCE only).
    SendWithImm = 3,
    /// RDMA READ.
    RdmaRead = 4,
    /// Atomic compare and swap (RoCE only).
    AtomicCmpAndSwp = 5,
    /// Atomic fetch and add (RoCE only).
    AtomicFetchAndAdd = 6,
    /// Local invalidate.
    LocalInv = 7,
    /// Bind memory window.
    BindMw = 8,
    /// SEND with invalidate.
    SendWithInv = 9,
}

impl WrOpcode {
    /// Decodes the C value.
    pub fn from_u32(v: u32) -> Option<WrOpcode> {
        use WrOpcode::*;
        Some(match v {
            0 => RdmaWrite,
            1 => RdmaWriteWithImm,
            2 => Send,
            3 => SendWithImm,
            4 => RdmaRead,
            5 => AtomicCmpAndSwp,
            6 => AtomicFetchAndAdd,
            7 => LocalInv,
            8 => BindMw,
            9 => SendWithInv,
            _ => return None,
        })
    }

    /// The completion opcode reported for this WR.
    pub fn wc_opcode(self) -> WcOpcode {
        match self {
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            WrOpcode::RdmaRead => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpAndSwp => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAndAdd => WcOpcode::FetchAdd,
            WrOpcode::LocalInv => WcOpcode::LocalInv,
            WrOpcode::BindMw => WcOpcode::BindMw,
            _ => WcOpcode::Send,
        }
    }
}

/// Send flags (`enum ibv_send_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendFlags(pub u32);

impl SendFlags {
    /// IBV_SEND_FENCE: wait for earlier RDMA READs to finish.
    pub const FENCE: SendFlags = SendFlags(1);
    /// IBV_SEND_SIGNALED: generate a completion.
    pub const SIGNALED: SendFlags = SendFlags(2);
    /// IBV_SEND_SOLICITED: solicited event at the receiver.
    pub const SOLICITED: SendFlags = SendFlags(4);
    /// IBV_SEND_INLINE: data copied at post time; lkeys ignored.
    pub const INLINE: SendFlags = SendFlags(8);

    /// True if every bit of `other` is set.
    pub fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

/// A send work request (`struct ibv_send_wr`, one element of the chain).
#[derive(Debug, Clone, Default)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub opcode: Option<WrOpcode>,
    /// Local buffers.
    pub sg_list: Vec<Sge>,
    /// Flags.
    pub flags: SendFlags,
    /// Immediate data (network order as given by the app) for *_WITH_IMM.
    pub imm_data: u32,
    /// Remote address for RDMA and atomics.
    pub remote_addr: u64,
    /// Remote key for RDMA and atomics.
    pub rkey: u32,
    /// Key to invalidate at the receiver, for SEND_WITH_INV.
    pub invalidate_rkey: u32,
    /// Compare value (ATOMIC_CMP_AND_SWP) or addend (ATOMIC_FETCH_AND_ADD).
    pub compare_add: u64,
    /// Swap value (ATOMIC_CMP_AND_SWP).
    pub swap: u64,
    /// Destination of a UD send (`wr.ud`): address vector, remote QPN and Q_Key.
    pub ud: Option<UdDest>,
    /// What a BIND_MW binds (`ibv_bind_mw` or `wr.bind_mw`).
    pub bind: Option<MwBind>,
}

/// A memory-window bind: the window `mw_rkey` (its current key) gets key `new_rkey` and
/// covers `[addr, addr + length)` of the MR with local key `mr_lkey`, with `access`
/// (remote rights); a `length` of 0 unbinds (type 1 only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MwBind {
    /// The window's key before the bind.
    pub mw_rkey: u32,
    /// Its key after the bind.
    pub new_rkey: u32,
    /// The MR's lkey.
    pub mr_lkey: u32,
    /// First byte (an address in the MR's iova space).
    pub addr: u64,
    /// Bytes; 0 unbinds.
    pub length: u64,
    /// Remote rights of the window.
    pub access: Access,
    /// The window's type (1 or 2).
    pub mw_type: u8,
    /// The window's PD id.
    pub mw_pd: u64,
}

/// Where a UD send goes (`ibv_send_wr.wr.ud`, with the AH's attributes copied at post time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UdDest {
    /// The address handle's attributes.
    pub ah: crate::qp::AhAttr,
    /// Destination QP number.
    pub remote_qpn: u32,
    /// Destination Q_Key (a value with the high bit set means "use the QP's own Q_Key").
    pub remote_qkey: u32,
}

impl SendWr {
    /// A SEND from the given buffers.
    pub fn send(wr_id: u64, sg_list: Vec<Sge>) -> SendWr {
        SendWr {
            wr_id,
            opcode: Some(WrOpcode::Send),
            sg_list,
            flags: SendFlags::SIGNALED,
            ..SendWr::default()
        }
    }

    /// An RDMA WRITE of the given buffers to `remote_addr`/`rkey`.
    pub fn write(wr_id: u64, sg_list: Vec<Sge>, remote_addr: u64, rkey: u32) -> SendWr {
        SendWr {
            wr_id,
            opcode: Some(WrOpcode::RdmaWrite),
            sg_list,
            flags: SendFlags::SIGNALED,
            remote_addr,
            rkey,
            ..SendWr::default()
        }
    }

    /// An RDMA READ from `remote_addr`/`rkey` into the given buffers.
    pub fn read(wr_id: u64, sg_list: Vec<Sge>, remote_addr: u64, rkey: u32) -> SendWr {
        SendWr {
            wr_id,
            opcode: Some(WrOpcode::RdmaRead),
            sg_list,
            flags: SendFlags::SIGNALED,
            remote_addr,
            rkey,
            ..SendWr::default()
        }
    }

    /// Total bytes described by the SG list (saturating).
    pub fn total_len(&self) -> u64 {
        self.sg_list.iter().map(|s| s.length as u64).sum()
    }
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Debug, Clone, Default)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Buffers to receive into.
    pub sg_list: Vec<Sge>,
}

/// Completion status (`enum ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum WcStatus {
    /// Success.
    Success = 0,
    /// Local length error.
    LocLenErr = 1,
    /// Local QP operation error.
    LocQpOpErr = 2,
    /// Local protection error (bad lkey or bounds).
    LocProtErr = 4,
    /// Flushed because the QP is in the error state.
    WrFlushErr = 5,
    /// A memory-window bind failed (`IBV_WC_MW_BIND_ERR`).
    MwBindErr = 6,
    /// Bad response.
    BadRespErr = 7,
    /// Local access error.
    LocAccessErr = 8,
    /// Remote invalid request (e.g. message too long for the receive buffer).
    RemInvReqErr = 9,
    /// Remote access error (bad rkey, bounds or rights).
    RemAccessErr = 10,
    /// Remote operation error.
    RemOpErr = 11,
    /// Transport retry counter exceeded.
    RetryExcErr = 12,
    /// RNR retry counter exceeded.
    RnrRetryExcErr = 13,
    /// Fatal error.
    FatalErr = 19,
    /// General error.
    GeneralErr = 21,
}

impl WcStatus {
    /// `ibv_wc_status_str` text.
    pub fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::FatalErr => "fatal error",
            WcStatus::GeneralErr => "general error",
        }
    }
}

/// Completion opcode (`enum ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum WcOpcode {
    /// SEND completed.
    Send = 0,
    /// RDMA WRITE completed.
    RdmaWrite = 1,
    /// RDMA READ completed.
    RdmaRead = 2,
    /// Compare and swap completed.
    CompSwap = 3,
    /// Fetch and add completed.
    FetchAdd = 4,
    /// Memory window bind.
    BindMw = 5,
    /// Local invalidate.
    LocalInv = 6,
    /// A receive completed.
    Recv = 128,
    /// A receive consumed by RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
}

/// Completion flags (`enum ibv_wc_flags`).
pub mod wc_flags {
    /// A GRH is present (UD).
    pub const GRH: u32 = 1;
    /// Immediate data is valid.
    pub const WITH_IMM: u32 = 2;
    /// `invalidated_rkey` is valid.
    pub const WITH_INV: u32 = 8;
}

/// A work completion (`struct ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// From the WR.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Provider detail: for iWARP Terminates, `layer << 16 | etype << 8 | code`.
    pub vendor_err: u32,
    /// Bytes received (receives) or transferred.
    pub byte_len: u32,
    /// Immediate data or invalidated rkey.
    pub imm_data: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Remote QP (UD).
    pub src_qp: u32,
    /// `wc_flags` bits.
    pub wc_flags: u32,
    /// P_Key index (UD receives).
    pub pkey_index: u16,
    /// Solicited event requested by the sender (receives).
    pub solicited: bool,
    /// `ibv_wc.sl`. Ethernet ports have no service level; a RoCE UD receive reports there
    /// the datagram's L3 header type as mlx5 does (bit 3: UDP, bits 2..0: 1 IPv6, 2 IPv4),
    /// which UCX's UD transport reads to find the destination address in the GRH.
    pub sl: u8,
}

impl WorkCompletion {
    /// A completion with the given status and zeroed details.
    pub fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            vendor_err: 0,
            byte_len: 0,
            imm_data: 0,
            qp_num,
            src_qp: 0,
            sl: 0,
            wc_flags: 0,
            pkey_index: 0,
            solicited: false,
        }
    }
}
