"""The code of every listed SGLang release that spec_fused patches or relies on:
``{release: {module: {function: '(signature)|code hash'}}}``.

Written by ``python scripts/compat_tier.py record`` from each release's wheel; the
CI run checks it (``record --check``). Do not edit by hand.
"""

TESTED_CODE = {
    '0.5.15': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True)|cc65110038edf4e6',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor)|4c73f9b85c31b989',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|478443d12540d42d',
            'FutureMap.resolve_mixed_spec_tails':
                'absent',
            'decide_needs_cpu_seq_lens':
                '(server_args: ServerArgs, attn_backends: Sequence[AttentionBackend])|7b74fe03ffb7d841',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|8895010b3eced7a6',
        },
    },
    '0.5.15.post1': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True)|f411b277078f90ff',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor)|4c73f9b85c31b989',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|478443d12540d42d',
            'FutureMap.resolve_mixed_spec_tails':
                'absent',
            'decide_needs_cpu_seq_lens':
                '(server_args: ServerArgs, attn_backends: Sequence[AttentionBackend])|7b74fe03ffb7d841',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|8895010b3eced7a6',
        },
    },
    '0.5.16': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True, needs_confidence_relay: bool=False)|956fbd97e832b929',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor, confidence: Optional[torch.Tensor]=None)|94c2710e5661bcfa',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|93ea07795cfdc4fe',
            'FutureMap.resolve_mixed_spec_tails':
                'absent',
            'decide_needs_cpu_seq_lens':
                '(server_args: ServerArgs, attn_backends: Sequence[AttentionBackend])|71abde6309b3d39d',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|4c614e7f468360aa',
        },
    },
    '0.5.17': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True, needs_confidence_relay: bool=False)|956fbd97e832b929',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor, confidence: Optional[torch.Tensor]=None)|94c2710e5661bcfa',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|93ea07795cfdc4fe',
            'FutureMap.resolve_mixed_spec_tails':
                'absent',
            'decide_needs_cpu_seq_lens':
                '(server_args: ServerArgs, attn_backends: Sequence[AttentionBackend])|71abde6309b3d39d',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|4c614e7f468360aa',
        },
    },
    '0.5.18': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True, needs_confidence_relay: bool=False)|a0a38ce039c450f2',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor, confidence: Optional[torch.Tensor]=None)|94c2710e5661bcfa',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|93ea07795cfdc4fe',
            'FutureMap.resolve_mixed_spec_tails':
                'absent',
            'decide_needs_cpu_seq_lens':
                '(server_args: ServerArgs, attn_backends: Sequence[AttentionBackend])|71abde6309b3d39d',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|f29a9cec4a73f048',
        },
    },
    '0.5.19': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True, needs_confidence_relay: bool=False)|9d5fa11cf1c30f8d',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor, confidence: Optional[torch.Tensor]=None)|f82225f4ad673ddc',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|93ea07795cfdc4fe',
            'FutureMap.resolve_mixed_spec_tails':
                '(self, batch: ScheduleBatch)|769659ab3e4b6982',
            'decide_needs_cpu_seq_lens':
                '(attn_backends: Sequence[AttentionBackend])|797ff0f02d40e849',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|f29a9cec4a73f048',
        },
    },
    '0.5.20': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True, needs_confidence_relay: bool=False)|9d5fa11cf1c30f8d',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor, confidence: Optional[torch.Tensor]=None)|f82225f4ad673ddc',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|93ea07795cfdc4fe',
            'FutureMap.resolve_mixed_spec_tails':
                '(self, batch: ScheduleBatch)|769659ab3e4b6982',
            'decide_needs_cpu_seq_lens':
                '(attn_backends: Sequence[AttentionBackend])|797ff0f02d40e849',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|f29a9cec4a73f048',
        },
    },
    '0.5.21': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True, needs_confidence_relay: bool=False)|9d5fa11cf1c30f8d',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor, confidence: Optional[torch.Tensor]=None)|f82225f4ad673ddc',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|93ea07795cfdc4fe',
            'FutureMap.resolve_mixed_spec_tails':
                '(self, batch: ScheduleBatch)|769659ab3e4b6982',
            'decide_needs_cpu_seq_lens':
                '(attn_backends: Sequence[AttentionBackend])|797ff0f02d40e849',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|f29a9cec4a73f048',
        },
    },
    '0.5.22': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True, needs_confidence_relay: bool=False)|9d5fa11cf1c30f8d',
            'FutureMap._adopt_relay':
                'absent',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor, confidence: Optional[torch.Tensor]=None)|f82225f4ad673ddc',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch)|93ea07795cfdc4fe',
            'FutureMap.resolve_mixed_spec_tails':
                '(self, batch: ScheduleBatch)|769659ab3e4b6982',
            'decide_needs_cpu_seq_lens':
                '(attn_backends: Sequence[AttentionBackend])|797ff0f02d40e849',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|f29a9cec4a73f048',
        },
    },
    '0.5.23': {
        'sglang.srt.managers.overlap_utils': {
            'FutureMap.__init__':
                '(self, device: torch.device, spec_algo: SpeculativeAlgorithm, req_to_token_pool: ReqToTokenPool, needs_cpu_seq_lens: bool=True, needs_confidence_relay: bool=False)|18fbffe6d91df66a',
            'FutureMap._adopt_relay':
                '(self, relay: FutureRelayBuffers)|09ba7852839d6ddd',
            'FutureMap.publish':
                '(self, future_indices: torch.Tensor, new_seq_lens: torch.Tensor, confidence: Optional[torch.Tensor]=None)|6072a97c47071895',
            'FutureMap.resolve_seq_lens_cpu':
                '(self, batch: ScheduleBatch, stream_ordered: bool=False)|1f6bdad1f7b3d81a',
            'FutureMap.resolve_mixed_spec_tails':
                '(self, batch: ScheduleBatch)|769659ab3e4b6982',
            'decide_needs_cpu_seq_lens':
                '(attn_backends: Sequence[AttentionBackend])|797ff0f02d40e849',
        },
        'sglang.srt.managers.scheduler': {
            'Scheduler._apply_war_barrier':
                '(self)|f29a9cec4a73f048',
        },
    },
}
