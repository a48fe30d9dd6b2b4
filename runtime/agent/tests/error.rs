//! How the agent's errors read when the binary prints them with their chain (`{:#}`).

use reflex_agent::error::AgentError;

#[test]
fn a_learner_error_says_its_message_once_even_printed_as_a_chain() {
    let e = AgentError::from(candle_core::Error::Msg("action_scales has 2 values".into()));
    assert_eq!(e.to_string(), "action_scales has 2 values");
    // The binary walks the sources after the message: none here, so nothing is said twice.
    assert!(std::error::Error::source(&e).is_none());
}
