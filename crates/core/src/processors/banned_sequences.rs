//! Banned token sequences as an Aho–Corasick automaton over token ids.
//!
//! The automaton state (a node id, kept in the [`DecoderState`]'s sequence-constraint slot) is
//! the longest suffix of the context that is a prefix of some banned sequence. At each step only
//! the tokens that would *complete* a banned sequence from the current state are masked — never
//! every token that occurs in one (000 §3.5). A one-token sequence is always banned. The
//! forbidden set of every node (over its whole suffix-link chain) is precomputed at compile time,
//! so a step costs O(forbidden tokens).

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::{v1, Apply, Compile, CompileCtx, StateField};
use crate::error::{Error, Result};
use crate::state::{DecoderState, SequenceSlot};
use crate::support::Workspace;
use crate::vocab::check_ids;
use crate::vocab::VocabInfo;

/// Implementation version.
pub const VERSION: u32 = 1;

/// Config of banned sequences (HF `bad_words_ids`, vLLM `bad_words` after tokenisation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BannedSequences {
    /// Processor version.
    #[serde(default = "v1")]
    pub version: u32,
    /// Token-id sequences that must never be completed.
    pub sequences: Vec<Vec<u32>>,
    /// Whether the prompt counts as context (a prompt ending in a prefix bans its completion).
    /// Default true (HF); vLLM matches output tokens only.
    #[serde(default = "crate::processors::presence_frequency::yes")]
    pub include_prompt: bool,
}

#[derive(Debug, Clone)]
struct Node {
    children: Vec<(u32, u32)>,
    fail: u32,
}

/// Aho–Corasick automaton over token ids with per-node forbidden next tokens.
#[derive(Debug, Clone)]
pub struct Automaton {
    nodes: Vec<Node>,
    forbidden: Vec<Vec<u32>>,
}

impl Automaton {
    fn child(&self, n: u32, t: u32) -> Option<u32> {
        let ch = &self.nodes[n as usize].children;
        ch.binary_search_by_key(&t, |e| e.0).ok().map(|i| ch[i].1)
    }

    /// The node after consuming `token` from `node` (root when `active` is false).
    pub(crate) fn next(&self, mut node: u32, token: u32, active: bool) -> u32 {
        if !active {
            return 0;
        }
        loop {
            if let Some(c) = self.child(node, token) {
                return c;
            }
            if node == 0 {
                return 0;
            }
            node = self.nodes[node as usize].fail;
        }
    }

    /// Tokens that would complete a banned sequence from `node`.
    pub fn forbidden(&self, node: u32) -> &[u32] {
        &self.forbidden[node as usize]
    }

    fn build(seqs: &[Vec<u32>]) -> Automaton {
        let mut nodes = vec![Node {
            children: Vec::new(),
            fail: 0,
        }];
        let mut terminal_next: Vec<Vec<u32>> = vec![Vec::new()];
        for s in seqs {
            let (last, prefix) = match s.split_last() {
                Some(x) => x,
                None => continue,
            };
            let mut n = 0u32;
            for &t in prefix {
                let found = nodes[n as usize]
                    .children
                    .iter()
                    .find(|e| e.0 == t)
                    .map(|e| e.1);
                n = match found {
                    Some(c) => c,
                    None => {
                        let id = nodes.len() as u32;
                        nodes.push(Node {
                            children: Vec::new(),
                            fail: 0,
                        });
                        terminal_next.push(Vec::new());
                        nodes[n as usize].children.push((t, id));
                        id
                    }
                };
            }
            terminal_next[n as usize].push(*last);
            // the completing token also extends the trie so longer overlaps are tracked
            if !nodes[n as usize].children.iter().any(|e| e.0 == *last) {
                let id = nodes.len() as u32;
                nodes.push(Node {
                    children: Vec::new(),
                    fail: 0,
                });
                terminal_next.push(Vec::new());
                nodes[n as usize].children.push((*last, id));
            }
        }
        for n in nodes.iter_mut() {
            n.children.sort_unstable();
        }
        // BFS for failure links
        let mut order = Vec::with_capacity(nodes.len());
        let mut q = VecDeque::new();
        let root_children: Vec<u32> = nodes[0].children.iter().map(|e| e.1).collect();
        for c in root_children {
            nodes[c as usize].fail = 0;
            q.push_back(c);
        }
        while let Some(n) = q.pop_front() {
            order.push(n);
            let children = nodes[n as usize].children.clone();
            for (t, c) in children {
                let mut f = nodes[n as usize].fail;
                let fail = loop {
                    if let Some(i) = nodes[f as usize]
                        .children
                        .iter()
                        .find(|e| e.0 == t)
                        .map(|e| e.1)
                    {
                        if i != c {
                            break i;
                        }
                    }
                    if f == 0 {
                        break 0;
                    }
                    f = nodes[f as usize].fail;
                };
                nodes[c as usize].fail = fail;
                q.push_back(c);
            }
        }
        // forbidden(n) = terminal_next(n) ∪ forbidden(fail(n)), in BFS order
        let mut forbidden: Vec<Vec<u32>> = vec![Vec::new(); nodes.len()];
        let mut root = terminal_next[0].clone();
        root.sort_unstable();
        root.dedup();
        forbidden[0] = root;
        for &n in &order {
            let mut f = terminal_next[n as usize].clone();
            f.extend_from_slice(&forbidden[nodes[n as usize].fail as usize]);
            f.sort_unstable();
            f.dedup();
            forbidden[n as usize] = f;
        }
        Automaton { nodes, forbidden }
    }
}

/// Compiled form.
#[derive(Debug, Clone)]
pub struct Compiled {
    automaton: Automaton,
    include_prompt: bool,
    slot: usize,
}

impl Compile for BannedSequences {
    const NAME: &'static str = "banned_sequences";
    const VERSION: u32 = VERSION;
    type Compiled = Compiled;

    fn version(&self) -> u32 {
        self.version
    }

    fn compile(&self, field: &str, ctx: &mut CompileCtx<'_>) -> Result<Compiled> {
        for (i, s) in self.sequences.iter().enumerate() {
            if s.is_empty() {
                return Err(Error::invalid(
                    format!("{field}.sequences[{i}]"),
                    "a banned sequence cannot be empty",
                ));
            }
            check_ids(&format!("{field}.sequences[{i}]"), s, ctx.vocab.vocab_size)?;
        }
        let slot = ctx.take_slot();
        Ok(Compiled {
            automaton: Automaton::build(&self.sequences),
            include_prompt: self.include_prompt,
            slot,
        })
    }
}

impl Apply for Compiled {
    fn reads(&self) -> &'static [StateField] {
        &[StateField::SequenceState]
    }

    fn new_slot(&self) -> Option<SequenceSlot> {
        Some(SequenceSlot::Banned { node: 0 })
    }

    fn consume(&self, slots: &mut [SequenceSlot], st: &DecoderState, pos: usize, token: u32) {
        if let Some(SequenceSlot::Banned { node }) = slots.get_mut(self.slot) {
            *node = self.automaton.next(
                *node,
                token,
                self.include_prompt || pos >= st.prompt_ids.len(),
            );
        }
    }

    fn apply(&self, st: &DecoderState, ws: &mut Workspace, _vocab: &VocabInfo) -> Result<()> {
        let node = match st.sequence.get(self.slot) {
            Some(SequenceSlot::Banned { node }) => *node,
            _ => 0,
        };
        for &t in self.automaton.forbidden(node) {
            ws.mask(t);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbids_only_the_completing_token() {
        let a = Automaton::build(&[vec![1, 2, 3], vec![2, 4], vec![9]]);
        let mut n = 0;
        assert_eq!(a.forbidden(n), &[9]);
        n = a.next(n, 1, true);
        assert_eq!(a.forbidden(n), &[9]);
        n = a.next(n, 2, true);
        // after "1 2": 3 completes [1,2,3], 4 completes [2,4] (suffix "2")
        assert_eq!(a.forbidden(n), &[3, 4, 9]);
        n = a.next(n, 5, true);
        assert_eq!(a.forbidden(n), &[9]);
        n = a.next(n, 2, true);
        assert_eq!(a.forbidden(n), &[4, 9]);
    }
}
