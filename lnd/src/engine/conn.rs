//! Connection states and every transition between them, in one table (o2iblnd's kib_conn states,
//! o2iblnd.h; what moves them is spread over o2iblnd_cb.c, gathered here).

use core::fmt;

/// Where a connection is in its life.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConnState {
    /// Being built: nothing sent yet.
    Init,
    /// CONNREQ sent, waiting for CONNACK or a reject; bounded by the connect deadline.
    ActiveConnect,
    /// CONNACK sent, waiting for the connection manager to say established.
    PassiveWait,
    /// Traffic flows.
    Established,
    /// Disconnect sent; waiting (bounded) for the peer's side to go.
    Closing,
    /// Torn down from the protocol's point of view; a zombie until connd reaps it (Destroy).
    Disconnected,
}

/// What can happen to a connection.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConnInput {
    /// We sent a CONNREQ.
    StartConnect,
    /// We accepted a CONNREQ.
    StartAccept,
    /// The handshake completed (and, on the active side, the CONNACK checked out).
    Established,
    /// The handshake failed: rejected, unreachable, a bad CONNACK, the deadline, or abandoned.
    HandshakeFailed,
    /// We close an established connection (error, shutdown, stale peer).
    Close,
    /// The connection manager says the connection is gone (peer disconnect or our own completing).
    Disconnected,
    /// The close waited long enough.
    CloseTimedOut,
}

/// A move the table does not allow: a bug in the engine or an event the fabric should not send.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct InvalidTransition {
    pub from: ConnState,
    pub input: ConnInput,
}

impl fmt::Display for InvalidTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no transition from {:?} on {:?}", self.from, self.input)
    }
}

impl ConnState {
    /// The whole state machine.
    pub fn next(self, input: ConnInput) -> Result<ConnState, InvalidTransition> {
        use ConnInput as I;
        use ConnState as S;
        Ok(match (self, input) {
            (S::Init, I::StartConnect) => S::ActiveConnect,
            (S::Init, I::StartAccept) => S::PassiveWait,
            (S::ActiveConnect | S::PassiveWait, I::Established) => S::Established,
            // A handshake that fails never reached a state the peer relies on: no Disconnect is
            // owed, straight to the reaper.
            (S::Init | S::ActiveConnect | S::PassiveWait, I::HandshakeFailed | I::Disconnected) => {
                S::Disconnected
            }
            (S::Established, I::Close) => S::Closing,
            // The peer closed first: we still send our Disconnect (it acknowledges), but there is
            // nothing to wait for.
            (S::Established, I::Disconnected) => S::Disconnected,
            (S::Closing, I::Disconnected | I::CloseTimedOut) => S::Disconnected,
            // Closing twice, or a disconnect for a zombie, changes nothing.
            (S::Closing, I::Close) => S::Closing,
            (S::Disconnected, I::Close | I::Disconnected | I::CloseTimedOut) => S::Disconnected,
            (from, input) => return Err(InvalidTransition { from, input }),
        })
    }

    /// Whether the connection counts as a zombie of its peer (closing, or waiting for the reaper).
    pub fn is_zombie(self) -> bool {
        matches!(self, ConnState::Closing | ConnState::Disconnected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATES: [ConnState; 6] = [
        ConnState::Init,
        ConnState::ActiveConnect,
        ConnState::PassiveWait,
        ConnState::Established,
        ConnState::Closing,
        ConnState::Disconnected,
    ];
    const INPUTS: [ConnInput; 7] = [
        ConnInput::StartConnect,
        ConnInput::StartAccept,
        ConnInput::Established,
        ConnInput::HandshakeFailed,
        ConnInput::Close,
        ConnInput::Disconnected,
        ConnInput::CloseTimedOut,
    ];

    /// The table, written out: any change to the state machine shows up here as a diff.
    #[test]
    fn transition_table() {
        let mut table = String::new();
        for s in STATES {
            for i in INPUTS {
                if let Ok(n) = s.next(i) {
                    table.push_str(&format!("{s:?} --{i:?}--> {n:?}\n"));
                }
            }
        }
        let expected = "\
Init --StartConnect--> ActiveConnect
Init --StartAccept--> PassiveWait
Init --HandshakeFailed--> Disconnected
Init --Disconnected--> Disconnected
ActiveConnect --Established--> Established
ActiveConnect --HandshakeFailed--> Disconnected
ActiveConnect --Disconnected--> Disconnected
PassiveWait --Established--> Established
PassiveWait --HandshakeFailed--> Disconnected
PassiveWait --Disconnected--> Disconnected
Established --Close--> Closing
Established --Disconnected--> Disconnected
Closing --Close--> Closing
Closing --Disconnected--> Disconnected
Closing --CloseTimedOut--> Disconnected
Disconnected --Close--> Disconnected
Disconnected --Disconnected--> Disconnected
Disconnected --CloseTimedOut--> Disconnected
";
        assert_eq!(table, expected);
    }

    /// Every state can reach Disconnected (so every connection can be reaped), and nothing leaves it.
    #[test]
    fn every_state_ends_disconnected() {
        for s in STATES {
            let mut frontier = vec![s];
            let mut seen = vec![s];
            while let Some(x) = frontier.pop() {
                for i in INPUTS {
                    if let Ok(n) = x.next(i) {
                        if !seen.contains(&n) {
                            seen.push(n);
                            frontier.push(n);
                        }
                    }
                }
            }
            assert!(seen.contains(&ConnState::Disconnected), "{s:?} cannot end");
        }
        for i in INPUTS {
            if let Ok(n) = ConnState::Disconnected.next(i) {
                assert_eq!(n, ConnState::Disconnected);
            }
        }
    }
}
