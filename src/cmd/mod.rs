//! One module per command: its arguments and what it prints. The work is in the libraries.

#[cfg(feature = "bench")]
pub mod bench;
pub mod bundle;
pub mod calibrate;
pub mod demo;
pub mod hw;
pub mod learn;
pub mod run;
pub mod sim;
pub mod tools;

/// `WIDTHxHEIGHT` in pixels, each 16 to 4096.
pub fn parse_size(s: &str) -> Result<(u32, u32), String> {
    let (w, h) = s
        .split_once('x')
        .ok_or_else(|| format!("`{s}` is not WIDTHxHEIGHT (e.g. 640x480)"))?;
    match (w.parse::<u32>(), h.parse::<u32>()) {
        (Ok(w), Ok(h)) if (16..=4096).contains(&w) && (16..=4096).contains(&h) => Ok((w, h)),
        _ => Err(format!("`{s}`: width and height between 16 and 4096 px")),
    }
}
