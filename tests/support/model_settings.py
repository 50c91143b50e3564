"""Settings of the small models that both ``tests/real_models.py`` and ``benchmarks/zoo.py``
build, written once.  Torch-free: the zoo's parent process reads them without importing torch.
"""

from __future__ import annotations

#: DeBERTa-v3's relative attention: content to position and back, log-bucketed positions,
#: keys shared between content and position.
DEBERTA_V3 = dict(
    relative_attention=True,
    pos_att_type=["p2c", "c2p"],
    position_buckets=16,
    max_relative_positions=-1,
    share_att_key=True,
    norm_rel_ebd="layer_norm",
)

#: A small Wav2Vec2's convolutions: two in its feature extractor (strides 5 and 2: 400 raw
#: samples make 39 frames) and its positional convolution in 4 groups, a kernel of 16.
WAV2VEC2_CONVOLUTIONS = dict(
    conv_dim=(32, 32),
    conv_stride=(5, 2),
    conv_kernel=(10, 3),
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=4,
)
WAV2VEC2_SAMPLES = 400
