"""Tokenizers (HF `tokenizers` over tokenizer.json or GGUF metadata), chat templates, streaming detokenizer."""

from augury.tokenizer.chat_template import ChatTemplateError, NoChatTemplateError
from augury.tokenizer.detokenizer import StreamDetokenizer
from augury.tokenizer.gguf_meta import read_gguf_metadata
from augury.tokenizer.tokenizer import Tokenizer

__all__ = ["ChatTemplateError", "NoChatTemplateError", "StreamDetokenizer", "Tokenizer", "read_gguf_metadata"]
