//! Stop strings, matched on the completion's text.
//!
//! Text that could be the beginning of a stop string is held back until it is known not to be, so
//! a client never receives text that a later match would have cut off. On a match the text is
//! truncated before it.
//!
//! All stop strings are searched at once by one Aho-Corasick automaton built when the request
//! starts, over the held-back text only, so a push costs time in the new text plus the longest
//! stop string, not in the number of stop strings (which validation bounds anyway).

use aho_corasick::{AhoCorasick, MatchKind};

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
    /// None without stop strings (or when it could not be built: see `fallback`).
    automaton: Option<AhoCorasick>,
    /// The stop strings, searched one by one, only if the automaton could not be built.
    fallback: Vec<String>,
    hold: usize,
    pending: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        let stops: Vec<&str> = stops
            .iter()
            .map(String::as_str)
            .filter(|s| !s.is_empty())
            .collect();
        let hold = stops.iter().map(|s| s.len()).max().unwrap_or(1) - 1;
        // Leftmost-first: the match that starts earliest wins, as a search for each string would.
        // Building fails only past the automaton's size limits, far above validation's bounds;
        // should it ever, each string is searched on its own (same result, slower).
        let automaton = (!stops.is_empty()).then(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostFirst)
                .build(&stops)
        });
        let (automaton, fallback) = match automaton {
            Some(Ok(a)) => (Some(a), Vec::new()),
            Some(Err(_)) => (None, stops.iter().map(|s| (*s).to_owned()).collect()),
            None => (None, Vec::new()),
        };
        Self {
            automaton,
            fallback,
            hold,
            pending: String::new(),
        }
    }

    /// Whether there are stop strings at all.
    pub fn is_active(&self) -> bool {
        self.automaton.is_some() || !self.fallback.is_empty()
    }

    /// Where the earliest stop string in the held-back text starts.
    fn first_match(&self) -> Option<usize> {
        match &self.automaton {
            Some(a) => a.find(self.pending.as_str()).map(|m| m.start()),
            None => self
                .fallback
                .iter()
                .filter_map(|s| self.pending.find(s.as_str()))
                .min(),
        }
    }

    /// Adds text; returns what can be sent now.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if !self.is_active() {
            return StopOutcome::Continue(text.to_owned());
        }
        self.pending.push_str(text);
        if let Some(at) = self.first_match() {
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

    /// The slow way: after each piece, search the whole text for each stop string; the first
    /// piece that completes one ends the text before the earliest match.
    fn naive(stops: &[String], pieces: &[String]) -> (String, bool) {
        let mut all = String::new();
        for p in pieces {
            all.push_str(p);
            if let Some(at) = stops.iter().filter_map(|s| all.find(s.as_str())).min() {
                return (all[..at].to_owned(), true);
            }
        }
        (all, false)
    }

    proptest::proptest! {
        #[test]
        fn matches_a_search_for_each_string(
            stops in proptest::collection::vec("[ab\u{e9}]{1,4}", 0..12),
            pieces in proptest::collection::vec("[abc\u{e9}]{0,5}", 0..12),
        ) {
            let refs: Vec<&str> = stops.iter().map(String::as_str).collect();
            let pieces_ref: Vec<&str> = pieces.iter().map(String::as_str).collect();
            proptest::prop_assert_eq!(run(&refs, &pieces_ref), naive(&stops, &pieces));
        }
    }
}
