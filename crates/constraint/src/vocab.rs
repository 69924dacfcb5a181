//! The vocabulary as the constraint engine sees it: the exact bytes of every token, a byte trie
//! over them (for nextok's own `choice` and small-regex masks), and the token environment that
//! llguidance needs (a `toktrie` trie built from the same bytes and the EOS ids).
//!
//! Special tokens never match grammar text: in the trie handed to llguidance their bytes are
//! prefixed with llguidance's special-token marker byte `0xFF`, and nextok's own trie leaves
//! them out. Tokens without bytes (padding) are never allowed. EOS ids are allowed exactly when
//! the constraint accepts.

use std::sync::Arc;

use nextok_core::{TokenBytes, VocabInfo};
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

use crate::error::ConstraintError;

/// A byte trie over the (non-special, non-empty) tokens of a vocabulary.
#[derive(Debug, Clone)]
pub(crate) struct VocabTrie {
    /// Nodes; node 0 is the root (the empty prefix).
    nodes: Vec<TrieNode>,
    /// `(byte, child node)` edges, each node's edges contiguous and sorted by byte.
    edges: Vec<(u8, u32)>,
    /// Token ids ending at a node, each node's ids contiguous.
    tokens: Vec<u32>,
}

/// Nodes are numbered in preorder: the children of node `i` are `i + 1 ..` up to
/// `subtree_end`.
#[derive(Debug, Clone, Copy)]
struct TrieNode {
    tok_start: u32,
    tok_end: u32,
    edge_start: u32,
    edge_end: u32,
    subtree_end: u32,
    byte: u8,
}

impl VocabTrie {
    fn build(bytes: &TokenBytes, skip: impl Fn(u32) -> bool) -> VocabTrie {
        let mut ids: Vec<u32> = bytes
            .iter()
            .filter(|(id, b)| !b.is_empty() && !skip(*id))
            .map(|(id, _)| id)
            .collect();
        ids.sort_by(|&a, &b| bytes.get(a).cmp(&bytes.get(b)));
        let mut t = VocabTrie {
            nodes: Vec::new(),
            edges: Vec::new(),
            tokens: Vec::new(),
        };
        t.build_node(bytes, &ids, 0, 0);
        t
    }

    fn build_node(&mut self, bytes: &TokenBytes, ids: &[u32], depth: usize, byte: u8) -> u32 {
        let me = self.nodes.len();
        let tok_start = self.tokens.len() as u32;
        let tok_of = |id: u32| bytes.get(id).unwrap_or(&[]);
        let mut i = 0;
        while i < ids.len() && tok_of(ids[i]).len() == depth {
            self.tokens.push(ids[i]);
            i += 1;
        }
        self.nodes.push(TrieNode {
            tok_start,
            tok_end: self.tokens.len() as u32,
            edge_start: 0,
            edge_end: 0,
            subtree_end: 0,
            byte,
        });
        let mut children = Vec::new();
        while i < ids.len() {
            let b = tok_of(ids[i])[depth];
            let mut j = i;
            while j < ids.len() && tok_of(ids[j])[depth] == b {
                j += 1;
            }
            let child = self.build_node(bytes, &ids[i..j], depth + 1, b);
            children.push((b, child));
            i = j;
        }
        let edge_start = self.edges.len() as u32;
        self.edges.extend_from_slice(&children);
        self.nodes[me].edge_start = edge_start;
        self.nodes[me].edge_end = self.edges.len() as u32;
        self.nodes[me].subtree_end = self.nodes.len() as u32;
        me as u32
    }

    /// The tokens whose bytes end exactly at `node`.
    #[inline]
    pub(crate) fn tokens_at(&self, node: u32) -> &[u32] {
        let n = &self.nodes[node as usize];
        &self.tokens[n.tok_start as usize..n.tok_end as usize]
    }

    /// The `(byte, child)` edges of `node`, sorted by byte.
    #[inline]
    pub(crate) fn edges(&self, node: u32) -> &[(u8, u32)] {
        let n = &self.nodes[node as usize];
        &self.edges[n.edge_start as usize..n.edge_end as usize]
    }

    /// The child of `node` along `byte`.
    #[inline]
    pub(crate) fn child(&self, node: u32, byte: u8) -> Option<u32> {
        let e = self.edges(node);
        e.binary_search_by_key(&byte, |&(b, _)| b)
            .ok()
            .map(|i| e[i].1)
    }

    /// The byte on the edge into `node` and the end of its subtree (preorder).
    #[inline]
    pub(crate) fn node_byte_end(&self, node: u32) -> (u8, u32) {
        let n = &self.nodes[node as usize];
        (n.byte, n.subtree_end)
    }

    /// Number of nodes.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }
}

/// A vocabulary prepared for constraints: token bytes, EOS and special ids, nextok's byte trie
/// and llguidance's token environment. Built once per tokenizer; cheap to share (`Arc`).
pub struct ConstraintVocab {
    pub(crate) bytes: TokenBytes,
    pub(crate) info: VocabInfo,
    pub(crate) trie: VocabTrie,
    pub(crate) tok_env: TokEnv,
}

impl std::fmt::Debug for ConstraintVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintVocab")
            .field("vocab_size", &self.info.vocab_size)
            .field("eos_token_ids", &self.info.eos_token_ids)
            .field("trie_nodes", &self.trie.len())
            .finish()
    }
}

impl ConstraintVocab {
    /// Prepares `bytes` (one entry per token id) with the EOS and special ids of `info`.
    /// At least one EOS id is required: it is how a constrained output ends.
    pub fn new(bytes: &TokenBytes, info: &VocabInfo) -> Result<ConstraintVocab, ConstraintError> {
        let info = info
            .validated()
            .map_err(|e| ConstraintError::invalid("vocabulary", e.to_string()).with_source(e))?;
        if bytes.len() != info.vocab_size {
            return Err(ConstraintError::invalid(
                "vocabulary",
                format!(
                    "{} token byte strings for vocab_size {}",
                    bytes.len(),
                    info.vocab_size
                ),
            ));
        }
        let Some(&eos) = info.eos_token_ids.first() else {
            return Err(ConstraintError::invalid(
                "vocabulary",
                "no EOS id: a constrained output needs an end-of-sequence token",
            ));
        };
        let is_special = |id: u32| info.is_special(id) || info.eos_token_ids.contains(&id);
        let trie = VocabTrie::build(bytes, is_special);
        let words: Vec<Vec<u8>> = bytes
            .iter()
            .map(|(id, b)| {
                if is_special(id) {
                    let mut w = Vec::with_capacity(b.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(b);
                    w
                } else {
                    b.to_vec()
                }
            })
            .collect();
        let rx = TokRxInfo::new(info.vocab_size as u32, eos);
        let tt = TokTrie::from(&rx, &words).with_eos_tokens(&info.eos_token_ids);
        let tok_env: TokEnv = Arc::new(ApproximateTokEnv::new(tt));
        Ok(ConstraintVocab {
            bytes: bytes.clone(),
            info,
            trie,
            tok_env,
        })
    }

    /// Number of token ids.
    pub fn vocab_size(&self) -> usize {
        self.info.vocab_size
    }

    /// The EOS ids (sorted).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.info.eos_token_ids
    }

    /// The exact bytes of token `id`.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id)
    }

    /// Whether `id` is an EOS id.
    #[inline]
    pub fn is_eos(&self, id: u32) -> bool {
        self.info.eos_token_ids.binary_search(&id).is_ok()
    }

    /// Whether `id` is special (EOS ids included): it never matches constraint text.
    #[inline]
    pub fn is_special(&self, id: u32) -> bool {
        self.info.is_special(id) || self.is_eos(id)
    }

    /// llguidance's token environment over this vocabulary.
    pub(crate) fn tok_env(&self) -> &TokEnv {
        &self.tok_env
    }
}
