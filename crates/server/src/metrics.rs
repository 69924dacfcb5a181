//! `GET /metrics`: Prometheus text. Requests by endpoint and status, prompt and completion
//! tokens, the engine's running and waiting sequences and KV cache bytes, and histograms of
//! time to first token and inter-token latency.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use nextok_engine::EngineStats;

const TTFT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        for (b, c) in self.bounds.iter().zip(self.counts.iter_mut()) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

#[derive(Debug)]
struct Inner {
    requests: BTreeMap<(String, u16), u64>,
    prompt_tokens: u64,
    completion_tokens: u64,
    ttft: Histogram,
    itl: Histogram,
}

/// The server's counters.
#[derive(Debug)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            inner: Mutex::new(Inner {
                requests: BTreeMap::new(),
                prompt_tokens: 0,
                completion_tokens: 0,
                ttft: Histogram::new(TTFT_BUCKETS),
                itl: Histogram::new(ITL_BUCKETS),
            }),
        }
    }
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // counters stay usable after a panic elsewhere
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request to `endpoint` ended with `status` (499: the client went away).
    pub fn request(&self, endpoint: &str, status: u16) {
        *self
            .lock()
            .requests
            .entry((endpoint.to_string(), status))
            .or_default() += 1;
    }

    /// Tokens of a finished generation.
    pub fn tokens(&self, prompt: usize, completion: usize) {
        let mut i = self.lock();
        i.prompt_tokens += prompt as u64;
        i.completion_tokens += completion as u64;
    }

    /// A request's time to its first token.
    pub fn ttft(&self, d: Duration) {
        self.lock().ttft.observe(d.as_secs_f64());
    }

    /// The time between two tokens of a request.
    pub fn itl(&self, d: Duration) {
        self.lock().itl.observe(d.as_secs_f64());
    }

    /// The Prometheus text, with the engine's gauges.
    pub fn render(&self, e: &EngineStats) -> String {
        let i = self.lock();
        let mut s = String::new();
        s.push_str("# HELP nextok_requests_total HTTP requests by endpoint and status (499: the client disconnected).\n# TYPE nextok_requests_total counter\n");
        for ((ep, st), n) in &i.requests {
            let _ = writeln!(
                s,
                "nextok_requests_total{{endpoint=\"{ep}\",status=\"{st}\"}} {n}"
            );
        }
        let counter = |s: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        let gauge = |s: &mut String, name: &str, help: &str, v: usize| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        counter(
            &mut s,
            "nextok_prompt_tokens_total",
            "Prompt tokens of finished requests.",
            i.prompt_tokens,
        );
        counter(
            &mut s,
            "nextok_completion_tokens_total",
            "Generated tokens of finished requests.",
            i.completion_tokens,
        );
        counter(
            &mut s,
            "nextok_engine_prompt_tokens_total",
            "Prompt tokens admitted by the engine.",
            e.prompt_tokens,
        );
        counter(
            &mut s,
            "nextok_engine_cached_prompt_tokens_total",
            "Prompt tokens served from the prefix cache.",
            e.cached_prompt_tokens,
        );
        counter(
            &mut s,
            "nextok_engine_completion_tokens_total",
            "Tokens generated by the engine (cancelled requests included).",
            e.completion_tokens,
        );
        counter(
            &mut s,
            "nextok_engine_iterations_total",
            "Forward passes run.",
            e.iterations,
        );
        counter(
            &mut s,
            "nextok_engine_preemptions_total",
            "Requests preempted to make room in the KV cache (recomputed when resumed).",
            e.preemptions,
        );
        gauge(
            &mut s,
            "nextok_running_sequences",
            "Sequences running.",
            e.running_seqs,
        );
        gauge(
            &mut s,
            "nextok_waiting_requests",
            "Requests waiting for admission.",
            e.waiting_requests,
        );
        gauge(
            &mut s,
            "nextok_kv_bytes_in_use",
            "Bytes of KV cache blocks alive (running sequences and the prefix cache).",
            e.kv_bytes_in_use,
        );
        gauge(
            &mut s,
            "nextok_constraint_cache_entries",
            "Compiled constraints kept for reuse.",
            e.constraint_cache_entries,
        );
        gauge(
            &mut s,
            "nextok_constraint_cache_bytes",
            "Estimated bytes of the compiled constraints kept.",
            e.constraint_cache_bytes,
        );
        gauge(
            &mut s,
            "nextok_kv_bytes_touched",
            "Bytes of KV cache memory written at least once (blocks alive and freed slots kept for reuse): the cache's resident memory.",
            e.kv_bytes_touched,
        );
        gauge(
            &mut s,
            "nextok_kv_bytes_reserved",
            "Bytes of KV cache blocks the running sequences hold (shared blocks once per sequence).",
            e.kv_bytes_reserved,
        );
        i.ttft.write(
            &mut s,
            "nextok_time_to_first_token_seconds",
            "Submission to a request's first token.",
        );
        i.itl.write(
            &mut s,
            "nextok_inter_token_latency_seconds",
            "Time between consecutive tokens of a request.",
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative() {
        let m = Metrics::default();
        m.ttft(Duration::from_millis(30));
        m.ttft(Duration::from_millis(300));
        m.request("chat", 200);
        m.request("chat", 200);
        let t = m.render(&EngineStats::default());
        assert!(t.contains("nextok_time_to_first_token_seconds_bucket{le=\"0.05\"} 1\n"));
        assert!(t.contains("nextok_time_to_first_token_seconds_bucket{le=\"0.5\"} 2\n"));
        assert!(t.contains("nextok_time_to_first_token_seconds_count 2\n"));
        assert!(t.contains("nextok_requests_total{endpoint=\"chat\",status=\"200\"} 2\n"));
    }
}
