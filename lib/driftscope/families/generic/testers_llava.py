"""Model testers' configs of the LLaVA-style composites (a vision tower, a projector and a language model, whose hub
layout transformers maps as LLaVA's): LLaVA, LLaVA-NeXT, LLaVA-OneVision, PaliGemma, Gemma 3, Mistral 3, InternVL,
Aya Vision. Model type -> (source, config); see ``testers``."""

from __future__ import annotations

TESTS = "huggingface/transformers tests/models"

#: LLaVA's and LLaVA-NeXT's testers' CLIP tower, apart from ``image_size``
CLIP_TOWER = {
    "patch_size": 2,
    "num_channels": 3,
    "hidden_size": 32,
    "projection_dim": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "dropout": 0.1,
    "attention_dropout": 0.1,
    "initializer_range": 0.02,
}

#: LLaVA's and LLaVA-NeXT's testers' Llama, apart from ``max_position_embeddings``
LLAMA = {
    "model_type": "llama",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "hidden_act": "gelu",
    "initializer_range": 0.02,
}

LLAVA_STYLE: dict[str, tuple[str, dict]] = {
    "llava": (
        f"{TESTS}/llava/test_modeling_llava.py, LlavaVisionText2TextModelTester",
        {
            "projector_hidden_act": "gelu",
            "vision_feature_select_strategy": "default",
            "vision_feature_layer": -1,
            "image_seq_length": 16,  # num_image_tokens: (image_size 8 // patch_size 2) ** 2
            "text_config": {**LLAMA, "max_position_embeddings": 512},
            "vision_config": {**CLIP_TOWER, "image_size": 8},
        },
    ),
    "llava_next": (
        f"{TESTS}/llava_next/test_modeling_llava_next.py, LlavaNextVisionText2TextModelTester",
        {
            "projector_hidden_act": "gelu",
            "vision_feature_select_strategy": "default",
            "vision_feature_layer": -1,
            "image_grid_pinpoints": [[32, 32]],
            "text_config": {**LLAMA, "max_position_embeddings": 580},
            "vision_config": {**CLIP_TOWER, "image_size": 16},
        },
    ),
    "llava_onevision": (
        f"{TESTS}/llava_onevision/test_modeling_llava_onevision.py, LlavaOnevisionVisionText2TextModelTester",
        {
            "projector_hidden_act": "gelu",
            "vision_feature_select_strategy": "full",
            "vision_feature_layer": -1,
            "image_grid_pinpoints": [[16, 16]],
            "text_config": {
                "model_type": "qwen2",
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "intermediate_size": 37,
                "hidden_act": "gelu",
                "max_position_embeddings": 580,
                "initializer_range": 0.02,
            },
            # no model_type: LlavaOnevisionConfig's default tower, SigLIP
            "vision_config": {**CLIP_TOWER, "image_size": 16, "patch_size": 8},
        },
    ),
    "paligemma": (
        f"{TESTS}/paligemma/test_modeling_paligemma.py, PaliGemmaVisionText2TextModelTester",
        {
            "projector_hidden_act": "gelu",
            "projection_dim": 32,
            "vision_feature_select_strategy": "default",
            "vision_feature_layer": -1,
            "text_config": {
                "model_type": "gemma",
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 1,
                "head_dim": 8,
                "intermediate_size": 37,
                "hidden_activation": "gelu_pytorch_tanh",
                "max_position_embeddings": 512,
                "initializer_range": 0.02,
            },
            "vision_config": {
                **CLIP_TOWER,
                "image_size": 30,
                "num_image_tokens": 4,
                "num_key_value_heads": 1,
            },
        },
    ),
    "gemma3": (
        f"{TESTS}/gemma3/test_modeling_gemma3.py, Gemma3Vision2TextModelTester",
        {
            "mm_tokens_per_image": 2,
            # Gemma3ModelTester (GemmaModelTester, a CausalLMModelTester): its defaults that Gemma3TextConfig names
            "text_config": {
                "hidden_size": 32,
                "intermediate_size": 37,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "max_position_embeddings": 512,
                "initializer_range": 0.02,
            },
            "vision_config": {
                "image_size": 20,
                "patch_size": 5,
                "num_channels": 3,
                "hidden_size": 32,
                "num_key_value_heads": 1,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 37,
                "dropout": 0.1,
                "attention_dropout": 0.1,
                "initializer_range": 0.02,
            },
        },
    ),
    "mistral3": (
        f"{TESTS}/mistral3/test_modeling_mistral3.py, Mistral3VisionText2TextModelTester",
        {
            "image_seq_length": 4,
            "vision_feature_layer": -1,
            "text_config": {
                "model_type": "mistral",
                "attention_dropout": 0.0,
                "hidden_act": "silu",
                "hidden_size": 32,
                "initializer_range": 0.02,
                "intermediate_size": 37,
                "max_position_embeddings": 512,
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "num_key_value_heads": 2,
                "rms_norm_eps": 1e-05,
                "rope_theta": 1000000000.0,
                "sliding_window": None,
            },
            "vision_config": {
                "model_type": "pixtral",
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 37,
                "image_size": 30,
                "patch_size": 6,
                "num_channels": 3,
                "hidden_act": "gelu",
            },
        },
    ),
    "internvl": (
        f"{TESTS}/internvl/test_modeling_internvl.py, InternVLVisionText2TextModelTester",
        {
            "image_seq_length": 64,
            "vision_feature_layer": -1,
            "text_config": {
                "model_type": "qwen2",
                "hidden_size": 128,
                "intermediate_size": 37,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "hidden_act": "silu",
                "max_position_embeddings": 512,
                "rope_theta": 10000,
                "tie_word_embeddings": True,
            },
            "vision_config": {
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 128,
                "image_size": 64,
                "patch_size": 4,
                "num_channels": 3,
                "hidden_act": "quick_gelu",
                "use_absolute_position_embeddings": True,
            },
        },
    ),
    "aya_vision": (
        f"{TESTS}/aya_vision/test_modeling_aya_vision.py, AyaVisionVisionText2TextModelTester",
        {
            "vision_feature_layer": -1,
            "downsample_factor": 2,
            "text_config": {
                "model_type": "cohere2",
                "hidden_size": 128,
                "intermediate_size": 37,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "hidden_act": "silu",
                "max_position_embeddings": 512,
                "tie_word_embeddings": True,
            },
            "vision_config": {
                "model_type": "siglip_vision_model",
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 128,
                "image_size": 64,
                "patch_size": 8,
                "vision_use_head": False,
            },
        },
    ),
}
