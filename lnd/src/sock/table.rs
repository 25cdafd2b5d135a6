//! The connection states of socklnd and every transition between them, in one place
//! (DESIGN.md: "keep every transition in one place and test the transition table").
//!
//! ```text
//! passive: AwaitRequest --RequestOk--> AwaitHello --HelloOk--> Established
//! active:  Dialing --Connected--> HelloSent --HelloAnswered--> Established
//! any state but Closing --Refused | ProtocolError | TimedOut | Ended | Close--> Closing
//! ```
//! The kernel has no explicit states (its connd reads the request and the HELLO
//! synchronously: `acceptor.c:lnet_accept`, `socklnd.c:ksocknal_create_conn`); these name its
//! steps so that each has a deadline.

/// Where a connection is.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConnState {
    /// Accepted; reading the acceptor request (16 B), `accept_timeout` per read.
    AwaitRequest,
    /// The request named our NID; reading the dialer's HELLO, `accept_timeout` per read.
    AwaitHello,
    /// Our TCP connect is under way (bounded by `timeout`).
    Dialing,
    /// Connected; request and HELLO sent, the answer due within `timeout`.
    HelloSent,
    /// HELLOs exchanged: KSOCK messages both ways.
    Established,
    /// Closed (graceful or abort); the driver reports nothing more for it.
    Closing,
}

/// What moves a connection.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConnInput {
    /// The acceptor request named our NID.
    RequestOk,
    /// The dialer's HELLO passed every rule and we answered it.
    HelloOk,
    /// Our dial connected.
    Connected,
    /// The peer answered our HELLO with a valid inverse type.
    HelloAnswered,
    /// We refused the connection, or the peer refused ours (ctype -1, 16-B reply).
    Refused,
    /// Bytes we cannot accept.
    ProtocolError,
    /// A deadline passed.
    TimedOut,
    /// The driver says the stream ended (EOF, reset), or the dial failed.
    Ended,
    /// We close it (shutdown, a sibling's error, a reboot, a duplicate).
    Close,
}

impl ConnState {
    pub const ALL: [ConnState; 6] = [
        ConnState::AwaitRequest,
        ConnState::AwaitHello,
        ConnState::Dialing,
        ConnState::HelloSent,
        ConnState::Established,
        ConnState::Closing,
    ];

    /// The name `conn show` prints.
    pub const fn name(self) -> &'static str {
        match self {
            ConnState::AwaitRequest => "await_request",
            ConnState::AwaitHello => "await_hello",
            ConnState::Dialing => "dialing",
            ConnState::HelloSent => "hello_sent",
            ConnState::Established => "established",
            ConnState::Closing => "closing",
        }
    }

    /// Before the HELLO is through (counted against `max_unauthenticated` when passive).
    pub const fn handshaking(self) -> bool {
        matches!(
            self,
            ConnState::AwaitRequest
                | ConnState::AwaitHello
                | ConnState::Dialing
                | ConnState::HelloSent
        )
    }
}

impl ConnInput {
    pub const ALL: [ConnInput; 9] = [
        ConnInput::RequestOk,
        ConnInput::HelloOk,
        ConnInput::Connected,
        ConnInput::HelloAnswered,
        ConnInput::Refused,
        ConnInput::ProtocolError,
        ConnInput::TimedOut,
        ConnInput::Ended,
        ConnInput::Close,
    ];
}

/// The one transition function: the next state, or `None` for an input the state cannot take
/// (the engine counts it and closes the connection).
pub const fn next_state(s: ConnState, i: ConnInput) -> Option<ConnState> {
    use ConnInput as I;
    use ConnState as S;
    match (s, i) {
        (S::AwaitRequest, I::RequestOk) => Some(S::AwaitHello),
        (S::AwaitHello, I::HelloOk) => Some(S::Established),
        (S::Dialing, I::Connected) => Some(S::HelloSent),
        (S::HelloSent, I::HelloAnswered) => Some(S::Established),
        (S::Closing, _) => None,
        (_, I::Refused | I::ProtocolError | I::TimedOut | I::Ended | I::Close) => Some(S::Closing),
        _ => None,
    }
}
