//! The tasks (reflex-tabletop's [`reflex_tabletop::task`]): what is on the table, how an
//! episode is randomised, and when it succeeded. The simulator's part is [`populate`]: the task's
//! objects as bodies in the physical scene.

pub use reflex_tabletop::task::*;

use crate::world::{BoxSpec, Scene};
use nalgebra::Isometry3;

/// Adds the task's objects to the scene. `tcp` is the pose of the tool centre point after the arm
/// was placed (the insert task puts the peg in the grasp and records its pose in the layout).
pub fn populate(layout: &mut TaskLayout, scene: &mut Scene, tcp: &Isometry3<f64>) {
    match layout.kind {
        TaskKind::Reach | TaskKind::Track => {}
        TaskKind::Push | TaskKind::Pick => {
            let h = CUBE_SIZE_M as f32 / 2.0;
            scene.add_object(&BoxSpec {
                half: [h, h, h],
                pose: layout.object_start.expect("cube pose"),
                mass: 0.05,
                friction: 0.8,
                color: [0.85, 0.15, 0.12],
            });
        }
        TaskKind::Insert => {
            let peg_pose = tcp * Isometry3::translation(0.0, 0.0, PEG_GRASP_OFFSET_M);
            layout.object_start = Some(peg_pose);
            let (s, l) = (PEG_SIZE_M as f32 / 2.0, PEG_LENGTH_M as f32 / 2.0);
            scene.add_object(&BoxSpec {
                half: [s, s, l],
                pose: peg_pose,
                mass: 0.02,
                friction: 0.8,
                color: [0.15, 0.35, 0.85],
            });
            // The hole: four walls around a square opening, centred on `target`.
            let (inner, outer, depth) = (HOLE_SIZE_M / 2.0, 0.04, HOLE_DEPTH_M);
            let wall = (outer - inner) / 2.0;
            let c = layout.target;
            let z = depth / 2.0;
            let color = [0.35, 0.6, 0.35];
            let mk = |dx: f64, dy: f64, hx: f64, hy: f64| BoxSpec {
                half: [hx as f32, hy as f32, (depth / 2.0) as f32],
                pose: Isometry3::translation(c.x + dx, c.y + dy, z),
                mass: 0.0,
                friction: 0.5,
                color,
            };
            scene.add_fixture(&[
                mk(inner + wall, 0.0, wall, outer),
                mk(-(inner + wall), 0.0, wall, outer),
                mk(0.0, inner + wall, inner, wall),
                mk(0.0, -(inner + wall), inner, wall),
            ]);
        }
    }
}
