"""The 3x3 convolution adapter that MoPPA puts before each Swin FFN (paper supp.)."""
import torch
import torch.nn as nn


class ConvAdapter(nn.Module):
    """Residual bottleneck with a 3x3 convolution, on channel-last tokens.

    ``x + up(act(conv3x3(down(x))))``: ``down`` and ``up`` are 1x1 projections
    (done as Linear layers on (B, H, W, C), no permute), the 3x3 convolution
    runs on the ``hidden_dims`` bottleneck. ``up`` starts at zero, so the adapter
    starts as the identity and the pre-trained block's output is unchanged.

    Args:
        embed_dims (int): Channels ``C``.
        hidden_dims (int): Bottleneck channels.
    """

    def __init__(self, embed_dims: int, hidden_dims: int) -> None:
        super().__init__()
        if hidden_dims < 1:
            raise ValueError(f'hidden_dims must be >= 1, got {hidden_dims}')
        self.embed_dims = embed_dims
        self.hidden_dims = hidden_dims
        self.down = nn.Linear(embed_dims, hidden_dims)
        self.conv = nn.Conv2d(hidden_dims, hidden_dims, 3, padding=1)
        self.act = nn.GELU()
        self.up = nn.Linear(hidden_dims, embed_dims)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.down.weight, a=5**0.5)
        nn.init.zeros_(self.down.bias)
        nn.init.kaiming_uniform_(self.conv.weight, a=5**0.5)
        nn.init.zeros_(self.conv.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: (B, H, W, C). Returns the same shape."""
        hidden = self.down(x)  # (B, H, W, r)
        hidden = self.conv(hidden.permute(0, 3, 1, 2))  # (B, r, H, W)
        hidden = self.act(hidden).permute(0, 2, 3, 1)  # (B, H, W, r)
        return x + self.up(hidden)  # (B, H, W, C)
