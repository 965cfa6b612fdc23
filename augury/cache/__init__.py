"""Prefix cache tiers: what KV outlives its request, in RAM and on SSD.

- RAM tier: finished requests' full blocks (and their last, partial block) stay
  in the KV pool as evictable cached blocks under `--prompt-cache-bytes`
  (`kv/block_manager.py` keeps them; `prefix_cache.PrefixCache` sets the budget).
- SSD tier: `ssd_store.SSDStore`, one file per block (`block_file.py`), written
  by a background thread, restored at admission on a RAM miss.
- Namespaces (`namespace.py`): model, tokenizer, KV codec, weight quantization,
  method; a drafter's own KV lives under `<namespace>/draft:<fingerprint>`.

Multi-turn rule. Cache keys are exact token ids, so turn 2 reuses turn 1 when
its prompt starts with turn 1's prompt ids followed by turn 1's *generated* ids
(the final token, typically EOS, has no KV yet and is recomputed). The engine
publishes the generated ids' blocks, so a client (or server-side history) that
sends the generated ids back — `prompt_ids + output_ids` + the new turn — hits
the whole history. A client that sends text instead relies on the chat template
re-tokenizing the assistant's answer to the same ids: SmolLM2-135M-Instruct's
ChatML template does (checked on greedy answers: the re-rendered turn 2 agrees
with prompt + generated ids up to the end of the answer, and reuses all of it).
Where a template re-tokenizes differently, the reuse stops at the first
differing id (whole blocks before it, plus the matching rows of that block by
copy-on-write): keep the generated ids as the history to get the full hit.
"""
