"""Tiny Hugging Face and timm models, built from configs with random weights (nothing downloaded)."""

import timm
import transformers as tf


def t5():
    return tf.T5ForConditionalGeneration(tf.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4,
                                                     vocab_size=512, d_kv=16))


def bert():
    return tf.BertModel(tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, vocab_size=300, max_position_embeddings=64))


def gpt2():
    return tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=300, n_positions=64,
                                            bos_token_id=0, eos_token_id=0))


def vit():
    return tf.ViTForImageClassification(tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                     intermediate_size=64, image_size=32, patch_size=8,
                                                     num_labels=10))


def whisper():
    return tf.WhisperForConditionalGeneration(tf.WhisperConfig(
        d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=32, max_target_positions=32,
        vocab_size=300, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1))


def timm_resnet():
    return timm.create_model("resnet10t", pretrained=False, num_classes=10)
