//! The layout sent with every recording.

use reflex_contracts::msg::RobotSpec;

/// The layout sent with every recording: the 3-D scene beside the action and joint plots, with
/// timing and events below.
pub fn blueprint(spec: &RobotSpec) -> rerun::blueprint::Blueprint {
    use rerun::blueprint::{
        Blueprint, ContainerLike, Horizontal, Spatial2DView, Spatial3DView, TextLogView,
        TimeSeriesView, Vertical,
    };
    let scene: ContainerLike = Spatial3DView::new("arm").with_origin("world").into();
    // Cameras under the 3-D view, side by side.
    let left: ContainerLike = if spec.cameras.is_empty() {
        scene
    } else {
        let cams: Vec<ContainerLike> = spec
            .cameras
            .iter()
            .map(|c| {
                Spatial2DView::new(c.name.clone())
                    .with_origin(crate::scene::camera_paths(c).0)
                    .into()
            })
            .collect();
        Vertical::new([scene, Horizontal::new(cams).into()])
            .with_row_shares([2.0, 1.0])
            .into()
    };
    let right: ContainerLike = Vertical::new([
        TimeSeriesView::new("actions").with_origin("action").into(),
        TimeSeriesView::new("joints").with_origin("joints").into(),
        TimeSeriesView::new("reward, success, takeover")
            .with_origin("episode")
            .into(),
    ])
    .into();
    let bottom: ContainerLike = Horizontal::new([
        TimeSeriesView::new("loop timing")
            .with_origin("timing")
            .into(),
        TimeSeriesView::new("status").with_origin("status").into(),
        TextLogView::new("events").with_origin("events").into(),
    ])
    .into();
    Blueprint::new(
        Vertical::new([Horizontal::new([left, right]).into(), bottom]).with_row_shares([3.0, 1.0]),
    )
}
