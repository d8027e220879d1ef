//! Stop strings, matched on the completion's text.
//!
//! Text that could be the beginning of a stop string is held back until it is known not to be, so
//! a client never receives text that a later match would have cut off. On a match the text is
//! truncated before it.

/// What a [`StopMatcher`] decided about new text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// No stop string yet; send this text.
    Continue(String),
    /// A stop string matched; send this text (everything before the match), then finish.
    Stopped(String),
}

/// Finds the first occurrence of any stop string in a growing text.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    hold: usize,
    pending: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        let stops: Vec<String> = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        let hold = stops.iter().map(|s| s.len()).max().unwrap_or(1) - 1;
        Self {
            stops,
            hold,
            pending: String::new(),
        }
    }

    /// Whether there are stop strings at all.
    pub fn is_active(&self) -> bool {
        !self.stops.is_empty()
    }

    /// Adds text; returns what can be sent now.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome::Continue(text.to_owned());
        }
        self.pending.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = first {
            let out = self.pending[..at].to_owned();
            self.pending.clear();
            return StopOutcome::Stopped(out);
        }
        // Everything but the last `hold` bytes can no longer start a match.
        let mut keep_from = self.pending.len().saturating_sub(self.hold);
        while !self.pending.is_char_boundary(keep_from) {
            keep_from -= 1;
        }
        let rest = self.pending.split_off(keep_from);
        StopOutcome::Continue(std::mem::replace(&mut self.pending, rest))
    }

    /// The held-back text, when the completion ends for another reason.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            match m.push(p) {
                StopOutcome::Continue(t) => out.push_str(&t),
                StopOutcome::Stopped(t) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.flush());
        (out, false)
    }

    #[test]
    fn truncates_before_a_match_split_across_pieces() {
        assert_eq!(
            run(&["STOP"], &["hello S", "TO", "P world"]),
            ("hello ".into(), true)
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(
            run(&["world", "lo"], &["hello world"]),
            ("hel".into(), true)
        );
    }

    #[test]
    fn no_match_returns_everything() {
        assert_eq!(run(&["xyz"], &["ab", "xy", "c"]), ("abxyc".into(), false));
        assert_eq!(run(&[], &["ab", "c"]), ("abc".into(), false));
    }

    #[test]
    fn holding_back_respects_character_boundaries() {
        let stops = vec!["終わり".to_string()];
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in ["日本", "語で", "終わ", "り", "x"] {
            let (StopOutcome::Continue(t) | StopOutcome::Stopped(t)) = m.push(p);
            out.push_str(&t);
        }
        assert_eq!(out, "日本語で");
    }

    #[test]
    fn held_back_text_is_never_sent_early() {
        let stops = vec!["abc".to_string()];
        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.push("xxab"), StopOutcome::Continue("xx".into()));
        assert_eq!(m.push("c"), StopOutcome::Stopped("".into()));
    }
}
