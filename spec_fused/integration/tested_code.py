"""The code of every listed SGLang release that spec_fused patches or relies on:
``{release: {module: {function: '(signature)|code hash'}}}``.

Written by ``python scripts/compat_tier.py record`` from each release's wheel; the
CI run checks it (``record --check``). Do not edit by hand.
"""

TESTED_CODE = {
    '0.5.15': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True)|b371280f0fb8f415',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor)|6bfc5ede22dd3918',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|73972f0273a8f7c4',
            'FutureMap.resolve_mixed_spec_tails':
                'absent',
            'decide_needs_cpu_seq_lens':
                '(server_args: ServerArgs, attn_backends: Sequence[AttentionBackend])|724a76d1dd60d38b',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|357b6721bd83ed42',
        },
    },
    '0.5.15.post1': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True)|92b5fa4ac96b9294',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor)|6bfc5ede22dd3918',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|73972f0273a8f7c4',
            'FutureMap.resolve_mixed_spec_tails':
                'absent',
            'decide_needs_cpu_seq_lens':
                '(server_args: ServerArgs, attn_backends: Sequence[AttentionBackend])|724a76d1dd60d38b',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|357b6721bd83ed42',
        },
    },
    '0.5.16': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True, needs_confidence_relay: bool=False)|f372a4a3d46c23ee',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor, confidence: Optional[torch.Tensor]=None)|f707a2b51c334ca7',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|58c2f4232ffae431',
            'FutureMap.resolve_mixed_spec_tails':
                'absent',
            'decide_needs_cpu_seq_lens':
                '(server_args: ServerArgs, attn_backends: Sequence[AttentionBackend])|d0b1961c8cff1b57',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|9e4222c2f1175149',
        },
    },
    '0.5.17': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True, needs_confidence_relay: bool=False)|f372a4a3d46c23ee',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor, confidence: Optional[torch.Tensor]=None)|f707a2b51c334ca7',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|58c2f4232ffae431',
            'FutureMap.resolve_mixed_spec_tails':
                'absent',
            'decide_needs_cpu_seq_lens':
                '(server_args: ServerArgs, attn_backends: Sequence[AttentionBackend])|d0b1961c8cff1b57',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|9e4222c2f1175149',
        },
    },
    '0.5.18': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True, needs_confidence_relay: bool=False)|26d61c7988b69168',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor, confidence: Optional[torch.Tensor]=None)|f707a2b51c334ca7',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|58c2f4232ffae431',
            'FutureMap.resolve_mixed_spec_tails':
                'absent',
            'decide_needs_cpu_seq_lens':
                '(server_args: ServerArgs, attn_backends: Sequence[AttentionBackend])|d0b1961c8cff1b57',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|f3e60b6acd187ee9',
        },
    },
    '0.5.19': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True, needs_confidence_relay: bool=False)|a6ddd64463785778',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor, confidence: Optional[torch.Tensor]=None)|4f4d8dee99296020',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|58c2f4232ffae431',
            'FutureMap.resolve_mixed_spec_tails':
                '(self, batch: ScheduleBatch)|02061d47642e7e30',
            'decide_needs_cpu_seq_lens':
                '(attn_backends: Sequence[AttentionBackend])|4e91eb492f75c7f6',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|f3e60b6acd187ee9',
        },
    },
    '0.5.20': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True, needs_confidence_relay: bool=False)|a6ddd64463785778',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor, confidence: Optional[torch.Tensor]=None)|4f4d8dee99296020',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|58c2f4232ffae431',
            'FutureMap.resolve_mixed_spec_tails':
                '(self, batch: ScheduleBatch)|02061d47642e7e30',
            'decide_needs_cpu_seq_lens':
                '(attn_backends: Sequence[AttentionBackend])|4e91eb492f75c7f6',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|f3e60b6acd187ee9',
        },
    },
    '0.5.21': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True, needs_confidence_relay: bool=False)|a6ddd64463785778',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor, confidence: Optional[torch.Tensor]=None)|4f4d8dee99296020',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|58c2f4232ffae431',
            'FutureMap.resolve_mixed_spec_tails':
                '(self, batch: ScheduleBatch)|02061d47642e7e30',
            'decide_needs_cpu_seq_lens':
                '(attn_backends: Sequence[AttentionBackend])|4e91eb492f75c7f6',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|f3e60b6acd187ee9',
        },
    },
    '0.5.22': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True, needs_confidence_relay: bool=False)|a6ddd64463785778',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor, confidence: Optional[torch.Tensor]=None)|4f4d8dee99296020',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|58c2f4232ffae431',
            'FutureMap.resolve_mixed_spec_tails':
                '(self, batch: ScheduleBatch)|02061d47642e7e30',
            'decide_needs_cpu_seq_lens':
                '(attn_backends: Sequence[AttentionBackend])|4e91eb492f75c7f6',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|f3e60b6acd187ee9',
        },
    },
    '0.5.23': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True, needs_confidence_relay: bool=False)|0bc17c83380a2db0',
            'FutureMap._adopt_relay':
                '(self, relay: FutureRelayBuffers)|6b9fbcb14d8271fe',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor, confidence: Optional[torch.Tensor]=None)|75b55b5a5e57a4b2',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch, stream_ordered: bool=False)|276a254776ce51f8',
            'FutureMap.resolve_mixed_spec_tails':
                '(self, batch: ScheduleBatch)|02061d47642e7e30',
            'decide_needs_cpu_seq_lens':
                '(attn_backends: Sequence[AttentionBackend])|4e91eb492f75c7f6',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|f3e60b6acd187ee9',
        },
    },
}
