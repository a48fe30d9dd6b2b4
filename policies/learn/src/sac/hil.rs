//! Human-in-the-loop data handling: where a step goes, and RLIF's intervention reward.

use super::Sac;
use super::replay::Transition;

/// Stores a step: a person's steps go to both the online and the demonstration buffer (HIL-SERL),
/// the policy's only to the online buffer. (LeRobot #3227: an overwritten flag silently kept
/// interventions out of the demo buffer; a test pins this routing.)
pub fn route(sac: &mut Sac, t: &Transition) {
    route_from(sac, super::replay::ONE_STREAM, t);
}

/// [`route`] for one of several actors whose steps interleave: into the buffers' `stream`.
pub fn route_from(sac: &mut Sac, stream: u64, t: &Transition) {
    sac.online.push_stream(stream, t);
    if t.intervention {
        sac.demo.push_stream(stream, t);
    }
}

/// RLIF (Luo et al. 2023): reward -1 on the policy step immediately before each takeover, 0
/// elsewhere. `takeover_steps` are the steps at which a person took over; returns the reward of
/// each of `len` steps.
pub fn rlif_rewards(takeover_steps: &[usize], len: usize) -> Vec<f32> {
    let mut r = vec![0.0; len];
    for &t in takeover_steps {
        if t > 0 && t <= len {
            r[t - 1] = -1.0;
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sac::{Mode, SacConfig};

    #[test]
    fn intervention_steps_land_in_both_buffers_policy_steps_only_online() {
        let mut sac = Sac::new(
            SacConfig {
                mode: Mode::Full,
                hidden: vec![8],
                ..Default::default()
            },
            2,
            1,
        )
        .unwrap();
        for i in 0..10 {
            let t = Transition {
                obs: vec![i as f32, 0.0],
                action: vec![0.0],
                next_obs: vec![0.0; 2],
                intervention: i % 3 == 0,
                ..Default::default()
            };
            route(&mut sac, &t);
        }
        assert_eq!(sac.online.total(), 10);
        assert_eq!(sac.demo.total(), 4, "steps 0, 3, 6, 9 were a person's");
    }

    #[test]
    fn rlif_puts_minus_one_exactly_before_each_takeover() {
        let r = rlif_rewards(&[10, 30], 40);
        for (t, v) in r.iter().enumerate() {
            assert_eq!(*v, if t == 9 || t == 29 { -1.0 } else { 0.0 }, "step {t}");
        }
        assert_eq!(
            rlif_rewards(&[0], 5),
            vec![0.0; 5],
            "a takeover at the first step has no policy step before it"
        );
    }
}
