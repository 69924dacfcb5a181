//! nextok's own byte automata: the `choice` trie and small regular expressions as a dense DFA.
//!
//! Both are walked together with the vocabulary's byte trie ([`crate::vocab::VocabTrie`]) to
//! build a mask: a token is allowed when its bytes lead from the current automaton state to a
//! live state, and the walk prunes every vocabulary subtree whose prefix is already dead, so a
//! mask costs the size of the intersection, not the vocabulary. When the automaton is small,
//! the mask of each state is computed once and cached in the compiled constraint (shared by all
//! sequences), so a later mask is a copy.

use std::sync::OnceLock;

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::util::{start, syntax};
use regex_automata::{Anchored, MatchKind};

use crate::error::{ConstraintError, LimitKind};
use crate::vocab::{ConstraintVocab, VocabTrie};

/// The dead state (no continuation is legal).
pub(crate) const DEAD: u32 = u32::MAX;
/// The state after EOS was committed.
pub(crate) const ENDED: u32 = u32::MAX - 1;

/// A trie over the byte strings of a `choice` constraint.
#[derive(Debug, Clone)]
pub(crate) struct ChoiceTrie {
    edges: Vec<Vec<(u8, u32)>>,
    terminal: Vec<bool>,
}

impl ChoiceTrie {
    pub(crate) fn new(
        choices: &[String],
        max_states: usize,
    ) -> Result<ChoiceTrie, ConstraintError> {
        if choices.is_empty() {
            return Err(ConstraintError::invalid(
                "choice",
                "the list of choices is empty",
            ));
        }
        let mut t = ChoiceTrie {
            edges: vec![Vec::new()],
            terminal: vec![false],
        };
        for c in choices {
            let mut n = 0usize;
            for &b in c.as_bytes() {
                n = match t.edges[n].binary_search_by_key(&b, |&(x, _)| x) {
                    Ok(i) => t.edges[n][i].1 as usize,
                    Err(i) => {
                        let id = t.edges.len();
                        if id >= max_states {
                            return Err(ConstraintError::limit_exceeded(
                                LimitKind::States,
                                format!("the choice trie needs more than {max_states} states"),
                            ));
                        }
                        t.edges[n].insert(i, (b, id as u32));
                        t.edges.push(Vec::new());
                        t.terminal.push(false);
                        id
                    }
                };
            }
            t.terminal[n] = true;
        }
        Ok(t)
    }
}

/// A small regular expression as a dense byte DFA (full match).
#[derive(Debug, Clone)]
pub(crate) struct ByteDfa {
    /// `trans[s * 256 + b]`: next state or [`DEAD`].
    trans: Vec<u32>,
    accept: Vec<bool>,
}

impl ByteDfa {
    /// Builds the DFA when the regex has at most `max_states` live states; `None` when it is
    /// larger or uses something the DFA builder does not handle (the caller falls back to
    /// llguidance, which reports real syntax errors).
    pub(crate) fn build(pattern: &str, max_states: usize) -> Option<ByteDfa> {
        let dfa = dense::Builder::new()
            .configure(
                dense::DFA::config()
                    .start_kind(StartKind::Anchored)
                    .match_kind(MatchKind::All)
                    .dfa_size_limit(Some(4 << 20))
                    .determinize_size_limit(Some(8 << 20)),
            )
            .syntax(syntax::Config::new().utf8(true))
            // a bounded repetition like `a{99999999}` would otherwise build a huge NFA first
            .thompson(regex_automata::nfa::thompson::Config::new().nfa_size_limit(Some(8 << 20)))
            .build(&format!(r"(?:{pattern})\z"))
            .ok()?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .ok()?;
        let mut ids = std::collections::HashMap::new();
        let mut order = vec![start];
        ids.insert(start, 0u32);
        let mut trans = Vec::new();
        let mut accept = Vec::new();
        let mut i = 0;
        while i < order.len() {
            let s = order[i];
            accept.push(dfa.is_match_state(dfa.next_eoi_state(s)));
            for b in 0..=255u8 {
                let n = dfa.next_state(s, b);
                if dfa.is_dead_state(n) || dfa.is_quit_state(n) {
                    trans.push(DEAD);
                    continue;
                }
                let id = match ids.get(&n) {
                    Some(&id) => id,
                    None => {
                        if order.len() >= max_states {
                            return None;
                        }
                        let id = order.len() as u32;
                        ids.insert(n, id);
                        order.push(n);
                        id
                    }
                };
                trans.push(id);
            }
            i += 1;
        }
        let mut d = ByteDfa { trans, accept };
        d.prune_dead();
        Some(d)
    }

    /// Redirects transitions into states from which no accepting state is reachable to
    /// [`DEAD`], so that "live" means "can still complete".
    fn prune_dead(&mut self) {
        let n = self.accept.len();
        let mut live = self.accept.clone();
        let mut changed = true;
        while changed {
            changed = false;
            for s in 0..n {
                if !live[s]
                    && self.trans[s * 256..s * 256 + 256]
                        .iter()
                        .any(|&t| t != DEAD && live[t as usize])
                {
                    live[s] = true;
                    changed = true;
                }
            }
        }
        for t in self.trans.iter_mut() {
            if *t != DEAD && !live[*t as usize] {
                *t = DEAD;
            }
        }
        if !live[0] {
            // Nothing matches at all: every transition from the start is dead.
            for t in self.trans[..256].iter_mut() {
                *t = DEAD;
            }
        }
    }
}

/// A byte automaton that nextok runs itself.
#[derive(Debug)]
pub(crate) struct Machine {
    kind: MachineKind,
    /// Per-state mask cache (present when the automaton is small enough).
    cache: Option<Vec<OnceLock<Box<[u64]>>>>,
}

#[derive(Debug)]
enum MachineKind {
    Trie(ChoiceTrie),
    Dfa(ByteDfa),
}

impl Machine {
    pub(crate) fn choice(t: ChoiceTrie, vocab: &ConstraintVocab, cache_bytes: usize) -> Machine {
        let n = t.terminal.len();
        Machine::with_cache(MachineKind::Trie(t), n, vocab, cache_bytes)
    }

    /// A DFA machine; when its masks fit the cache, all of them are computed now, so that no
    /// sequence step ever walks the vocabulary (the cost moves to compile time).
    pub(crate) fn dfa(d: ByteDfa, vocab: &ConstraintVocab, cache_bytes: usize) -> Machine {
        let n = d.accept.len();
        let m = Machine::with_cache(MachineKind::Dfa(d), n, vocab, cache_bytes);
        if m.cache.is_some() {
            let mut scratch = vec![0u64; nextok_core::constraint::bitset_words(vocab.vocab_size())];
            for s in 0..n as u32 {
                m.fill(s, vocab, &mut scratch);
            }
        }
        m
    }

    fn with_cache(
        kind: MachineKind,
        n: usize,
        vocab: &ConstraintVocab,
        cache_bytes: usize,
    ) -> Machine {
        let per_state = nextok_core::constraint::bitset_words(vocab.vocab_size()) * 8;
        let cache = (n.saturating_mul(per_state) <= cache_bytes)
            .then(|| (0..n).map(|_| OnceLock::new()).collect());
        Machine { kind, cache }
    }

    /// An estimate of the heap memory held: the automaton and the masks cached so far.
    pub(crate) fn estimated_bytes(&self) -> usize {
        use std::mem::size_of;
        let automaton = match &self.kind {
            MachineKind::Trie(t) => {
                t.edges
                    .iter()
                    .map(|e| size_of::<Vec<(u8, u32)>>() + e.capacity() * size_of::<(u8, u32)>())
                    .sum::<usize>()
                    + t.terminal.capacity()
            }
            MachineKind::Dfa(d) => d.trans.capacity() * size_of::<u32>() + d.accept.capacity(),
        };
        let cache = self.cache.as_ref().map_or(0, |c| {
            c.len() * size_of::<OnceLock<Box<[u64]>>>()
                + c.iter()
                    .filter_map(|m| m.get())
                    .map(|m| m.len() * size_of::<u64>())
                    .sum::<usize>()
        });
        automaton + cache
    }

    /// Number of states.
    pub(crate) fn num_states(&self) -> usize {
        match &self.kind {
            MachineKind::Trie(t) => t.terminal.len(),
            MachineKind::Dfa(d) => d.accept.len(),
        }
    }

    /// The start state.
    pub(crate) fn start(&self) -> u32 {
        match &self.kind {
            MachineKind::Dfa(d) if d.trans[..256].iter().all(|&t| t == DEAD) && !d.accept[0] => {
                DEAD
            }
            _ => 0,
        }
    }

    /// The state after `b`, or [`DEAD`].
    #[inline]
    pub(crate) fn next(&self, s: u32, b: u8) -> u32 {
        if s >= ENDED {
            return DEAD;
        }
        match &self.kind {
            MachineKind::Trie(t) => {
                let e = &t.edges[s as usize];
                match e.binary_search_by_key(&b, |&(x, _)| x) {
                    Ok(i) => e[i].1,
                    Err(_) => DEAD,
                }
            }
            MachineKind::Dfa(d) => d.trans[s as usize * 256 + b as usize],
        }
    }

    /// Whether the bytes so far are a complete output.
    #[inline]
    pub(crate) fn accepting(&self, s: u32) -> bool {
        if s >= ENDED {
            return false;
        }
        match &self.kind {
            MachineKind::Trie(t) => t.terminal[s as usize],
            MachineKind::Dfa(d) => d.accept[s as usize],
        }
    }

    /// Whether any byte may follow.
    pub(crate) fn can_continue(&self, s: u32) -> bool {
        if s >= ENDED {
            return false;
        }
        match &self.kind {
            MachineKind::Trie(t) => !t.edges[s as usize].is_empty(),
            MachineKind::Dfa(d) => d.trans[s as usize * 256..s as usize * 256 + 256]
                .iter()
                .any(|&t| t != DEAD),
        }
    }

    /// The state after `bytes` (or [`DEAD`]).
    pub(crate) fn run(&self, mut s: u32, bytes: &[u8]) -> u32 {
        for &b in bytes {
            s = self.next(s, b);
            if s == DEAD {
                break;
            }
        }
        s
    }

    /// Bytes forced from `s`: the path along which every state has exactly one live byte and is
    /// not accepting.
    pub(crate) fn forced(&self, mut s: u32) -> Vec<u8> {
        let mut out = Vec::new();
        while s < ENDED && !self.accepting(s) && out.len() < 4096 {
            let mut only = None;
            let mut count = 0;
            match &self.kind {
                MachineKind::Trie(t) => {
                    count = t.edges[s as usize].len();
                    if count == 1 {
                        only = Some(t.edges[s as usize][0]);
                    }
                }
                MachineKind::Dfa(d) => {
                    for b in 0..=255u8 {
                        let n = d.trans[s as usize * 256 + b as usize];
                        if n != DEAD {
                            count += 1;
                            only = Some((b, n));
                        }
                    }
                }
            }
            match (count, only) {
                (1, Some((b, n))) => {
                    out.push(b);
                    s = n;
                }
                _ => break,
            }
        }
        out
    }

    /// ORs into `out` the mask of state `s` (EOS ids included when `s` accepts).
    pub(crate) fn fill(&self, s: u32, vocab: &ConstraintVocab, out: &mut [u64]) {
        if s == ENDED {
            set_eos(vocab, out);
            return;
        }
        if s == DEAD {
            return;
        }
        if let Some(cache) = &self.cache {
            let m = cache[s as usize].get_or_init(|| {
                let mut m = vec![0u64; out.len()].into_boxed_slice();
                self.compute(s, vocab, &mut m);
                m
            });
            for (o, w) in out.iter_mut().zip(m.iter()) {
                *o |= *w;
            }
        } else {
            self.compute(s, vocab, out);
        }
    }

    fn compute(&self, s: u32, vocab: &ConstraintVocab, out: &mut [u64]) {
        match &self.kind {
            MachineKind::Trie(_) => self.walk(&vocab.trie, 0, s, out),
            MachineKind::Dfa(d) => walk_dfa(d, &vocab.trie, s, out),
        }
        if self.accepting(s) {
            set_eos(vocab, out);
        }
    }

    fn walk(&self, vt: &VocabTrie, vnode: u32, s: u32, out: &mut [u64]) {
        match &self.kind {
            MachineKind::Trie(t) => {
                for &(b, s2) in &t.edges[s as usize] {
                    if let Some(child) = vt.child(vnode, b) {
                        set_all(vt.tokens_at(child), out);
                        self.walk(vt, child, s2, out);
                    }
                }
            }
            MachineKind::Dfa(d) => {
                let row = &d.trans[s as usize * 256..s as usize * 256 + 256];
                for &(b, child) in vt.edges(vnode) {
                    let s2 = row[b as usize];
                    if s2 != DEAD {
                        set_all(vt.tokens_at(child), out);
                        self.walk(vt, child, s2, out);
                    }
                }
            }
        }
    }
}

/// The DFA walk over the vocabulary trie in preorder: a dead transition skips the whole
/// subtree; a stack holds the DFA state of each open ancestor.
fn walk_dfa(d: &ByteDfa, vt: &VocabTrie, s: u32, out: &mut [u64]) {
    let n = vt.len() as u32;
    let mut stack: Vec<(u32, u32)> = Vec::with_capacity(64);
    stack.push((n, s));
    let mut i = 1;
    while i < n {
        let (byte, end) = vt.node_byte_end(i);
        while i >= stack.last().expect("root stays").0 {
            stack.pop();
        }
        let parent = stack.last().expect("root stays").1;
        let s2 = d.trans[parent as usize * 256 + byte as usize];
        if s2 == DEAD {
            i = end;
            continue;
        }
        set_all(vt.tokens_at(i), out);
        stack.push((end, s2));
        i += 1;
    }
}

#[inline]
fn set_all(ids: &[u32], out: &mut [u64]) {
    for &t in ids {
        out[(t / 64) as usize] |= 1u64 << (t % 64);
    }
}

fn set_eos(vocab: &ConstraintVocab, out: &mut [u64]) {
    set_all(vocab.eos_token_ids(), out);
}
