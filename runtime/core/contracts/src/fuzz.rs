//! Property tests of every decoder whose output reaches the loop, the learner or the recorder:
//! arbitrary bytes, and valid messages with bytes flipped, cut or inserted, never panic the
//! decoder or the validators; and whatever a validator lets through is safe to index by the spec.
//!
//! `REFLEX_FUZZ_CASES` sets the cases per property (default 2,000, what CI runs; the reported
//! fuzz run used 1,000,000: `REFLEX_FUZZ_CASES=1000000 cargo test --release -p reflex-contracts
//! fuzz`).

use crate::msg::*;
use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("REFLEX_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

fn spec() -> RobotSpec {
    RobotSpec::new("arm", "test", 20.0)
        .with_state("ee_pos", 3, "m")
        .with_state("rest", 5, "")
        .with_action(ActionKind::Box, &["a", "b", "c"], -1.0, 1.0)
}

fn observation() -> Observation {
    Observation {
        v: PROTOCOL_VERSION,
        seq: 3,
        episode: 1,
        step: 2,
        time_ns: 100,
        state: vec![0.5; 8],
        reward: 1.0,
        images: vec![Image {
            camera: "front".into(),
            width: 2,
            height: 2,
            encoding: "rgb8".into(),
            seq: 0,
            age_ns: 0,
            data: vec![7; 12],
        }],
        ..Default::default()
    }
}

/// Valid encodings of every message type a peer can send.
fn corpus() -> Vec<Vec<u8>> {
    let step = WireStep {
        obs: vec![0.1; 8],
        next_obs: vec![0.2; 8],
        base: vec![0.0; 3],
        action: vec![0.5; 3],
        reward: 1.0,
        ..Default::default()
    };
    vec![
        encode(&spec()),
        encode(&observation()),
        encode(&Command {
            v: PROTOCOL_VERSION,
            seq: 9,
            action: vec![0.1, 0.2, 0.3],
        }),
        encode(&TeleopMsg {
            v: PROTOCOL_VERSION,
            seq: 1,
            action: vec![0.0; 3],
            intervene: true,
            ..Default::default()
        }),
        encode(&WeightsChunk {
            v: PROTOCOL_VERSION,
            version: 2,
            offset: 4,
            total: 16,
            arch: 5,
            values: vec![0.5; 4],
        }),
        encode(&TransitionBatch {
            v: PROTOCOL_VERSION,
            actor: 3,
            first_seq: 10,
            held_from: 2,
            steps: vec![step.clone(), step],
            flush: false,
            offered: 0,
        }),
        encode(&ResetRequest {
            v: PROTOCOL_VERSION,
            seed: Some(4),
        }),
        encode(&OperatorMsg {
            v: PROTOCOL_VERSION,
            kind: OperatorKind::Release,
            estops: 3,
            source: "operator".into(),
            to: String::new(),
        }),
    ]
}

/// Decodes `bytes` as every message type and runs the validators on what decodes: nothing may
/// panic; what passes must fit.
fn decode_everything(bytes: &[u8]) {
    let s = spec();
    if let Ok(o) = decode::<Observation>("k", bytes)
        && o.check_against(&s).is_ok()
    {
        assert_eq!(o.state.len(), s.state_dim());
        let r = s.field("ee_pos").unwrap();
        let _ = &o.state[r];
    }
    if let Ok(sp) = decode::<RobotSpec>("k", bytes)
        && sp.validate().is_ok()
    {
        let n = sp.action.dim();
        assert!(sp.action.low.len() == n && sp.action.high.len() == n);
        let _ = sp.state_dim();
    }
    let _ = decode::<Command>("k", bytes);
    let _ = decode::<TeleopMsg>("k", bytes);
    let _ = decode::<WeightsChunk>("k", bytes);
    let _ = decode::<TransitionBatch>("k", bytes);
    let _ = decode::<ResetRequest>("k", bytes);
    let _ = decode::<LearnerState>("k", bytes);
    let _ = decode::<EpisodeEvent>("k", bytes);
    if let Ok(m) = decode::<OperatorMsg>("k", bytes) {
        // What reaches a log line from another process is bounded and printable.
        let who = crate::stop::clean_name(&m.source);
        assert!(who.len() <= crate::stop::MAX_WHO && who.is_ascii());
    }
    let _ = decode::<StepTrace>("k", bytes);
    let _ = decode::<TraceFrames>("k", bytes);
    let _ = decode::<StatusMsg>("k", bytes);
    let _ = decode::<StopStatus>("k", bytes);
}

/// A valid message with `edits` applied: (position, kind, byte).
fn mutate(base: &[u8], edits: &[(usize, u8, u8)]) -> Vec<u8> {
    let mut b = base.to_vec();
    for &(pos, kind, byte) in edits {
        if b.is_empty() {
            b.push(byte);
            continue;
        }
        let i = pos % b.len();
        match kind % 4 {
            0 => b[i] = byte,
            1 => b[i] ^= 1 << (byte % 8),
            2 => b.insert(i, byte),
            _ => b.truncate(i),
        }
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_a_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        decode_everything(&bytes);
    }

    #[test]
    fn mutated_valid_messages_never_panic_a_decoder_or_a_validator(
        which in 0usize..8,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6),
    ) {
        let c = corpus();
        decode_everything(&mutate(&c[which % c.len()], &edits));
    }
}
