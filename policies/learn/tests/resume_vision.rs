//! A checkpoint's image heads against the run's `[learner.vision]` on resume: the heads' shape
//! and training must match, the maps' shift (a batch's augmentation) follows the run.

use reflex_learn::sac::{FeatureShape, VisionHeads};

fn heads(shift: usize) -> VisionHeads {
    VisionHeads {
        encoder_id: "pick-seeing.encoder.onnx#1234".into(),
        features: vec![FeatureShape {
            camera: "front".into(),
            channels: 8,
            height: 16,
            width: 16,
        }],
        embeddings: 8,
        width: 256,
        bc_trains_heads: true,
        shift,
    }
}

#[test]
fn a_new_shift_is_taken_and_said_while_the_heads_stay() {
    let mut saved = Some(heads(0));
    let changed = VisionHeads::resume(&mut saved, &Some(heads(1))).unwrap();
    assert_eq!(changed, Some((0, 1)));
    assert_eq!(
        saved,
        Some(heads(1)),
        "the run's shift applies from here on"
    );
    // Nothing changed: nothing said.
    assert_eq!(VisionHeads::resume(&mut saved, &Some(heads(1))), Ok(None));
    let mut state_only = None;
    assert_eq!(VisionHeads::resume(&mut state_only, &None), Ok(None));
}

#[test]
fn other_heads_or_their_training_are_refused_with_both_sides_described() {
    let other_encoder = VisionHeads {
        encoder_id: "other.encoder.onnx#99".into(),
        ..heads(0)
    };
    let narrower = VisionHeads {
        width: 64,
        ..heads(0)
    };
    let critic_only = VisionHeads {
        bc_trains_heads: false,
        ..heads(0)
    };
    for (now, says) in [
        (Some(other_encoder), "other.encoder.onnx#99"),
        (Some(narrower), "heads 8x64"),
        (Some(critic_only), "critic only"),
        (None, "no camera (state only)"),
    ] {
        let mut saved = Some(heads(0));
        let e = VisionHeads::resume(&mut saved, &now).unwrap_err();
        assert!(
            e.contains("pick-seeing.encoder.onnx#1234") && e.contains(says),
            "{e}"
        );
        assert_eq!(saved, Some(heads(0)), "a refusal changes nothing");
    }
    let mut state_only = None;
    let e = VisionHeads::resume(&mut state_only, &Some(heads(1))).unwrap_err();
    assert!(
        e.starts_with("it learned from no camera (state only)"),
        "{e}"
    );
}
