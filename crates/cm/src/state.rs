//! The rdma_cm_id state machine (kernel `enum rdma_cm_state`).

/// Where an id is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmState {
    /// Fresh.
    Idle,
    /// Address resolution in progress.
    AddrQuery,
    /// Address resolved (a device is attached).
    AddrResolved,
    /// Route resolution in progress.
    RouteQuery,
    /// Route resolved; ready to connect.
    RouteResolved,
    /// Connecting or connected.
    Connect,
    /// Disconnected.
    Disconnect,
    /// Bound to an address.
    AddrBound,
    /// Listening.
    Listen,
    /// Being destroyed.
    Destroying,
}

impl std::fmt::Display for CmState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            CmState::Idle => "IDLE",
            CmState::AddrQuery => "ADDR_QUERY",
            CmState::AddrResolved => "ADDR_RESOLVED",
            CmState::RouteQuery => "ROUTE_QUERY",
            CmState::RouteResolved => "ROUTE_RESOLVED",
            CmState::Connect => "CONNECT",
            CmState::Disconnect => "DISCONNECT",
            CmState::AddrBound => "ADDR_BOUND",
            CmState::Listen => "LISTEN",
            CmState::Destroying => "DESTROYING",
        };
        f.write_str(s)
    }
}

/// Port spaces (`enum rdma_port_space`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum PortSpace {
    /// IPoIB.
    Ipoib = 0x0002,
    /// Reliable connected, TCP-like semantics.
    Tcp = 0x0106,
    /// Unreliable datagram (needs the RoCE device).
    Udp = 0x0111,
    /// Any QP type.
    Ib = 0x013F,
}

impl PortSpace {
    /// Decodes the C value.
    pub fn from_u32(v: u32) -> Option<PortSpace> {
        Some(match v {
            0x0002 => PortSpace::Ipoib,
            0x0106 => PortSpace::Tcp,
            0x0111 => PortSpace::Udp,
            0x013F => PortSpace::Ib,
            _ => return None,
        })
    }
}
