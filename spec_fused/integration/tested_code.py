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
        'sglang.srt.layers.attention.flashinfer_backend': {
            'fast_prefill_plan':
                "(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor, paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int, head_dim_vo: Optional[int]=None, custom_mask: Optional[torch.Tensor]=None, causal: bool=False, window_left: int=-1, q_data_type: Union[str, torch.dtype]='float16', kv_data_type: Optional[Union[str, torch.dtype]]=None, o_data_type: Optional[Union[str, torch.dtype]]=None, non_blocking: bool=True, fixed_split_size: Optional[int]=None, prefix_len_ptr: Optional[torch.Tensor]=None, token_pos_in_items_ptr: Optional[torch.Tensor]=None, token_pos_in_items_len: int=0, max_item_len_ptr: Optional[torch.Tensor]=None, *, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor, kv_lens_host: torch.Tensor, max_q_len: int, max_kv_len: int)|d7393acf5a116aa3",
            'FlashInferAttnBackend.init_forward_metadata_out_graph':
                '(self, forward_batch: ForwardBatch, in_capture: bool=False)|b317d0036214c00a',
            'FlashInferIndicesUpdaterPrefill.call_begin_forward':
                '(self, wrapper_ragged: BatchPrefillWithRaggedKVCacheWrapper, wrapper_paged: BatchPrefillWithPagedKVCacheWrapper, req_pool_indices: torch.Tensor, paged_kernel_lens: torch.Tensor, paged_kernel_lens_sum: int, seq_lens: torch.Tensor, prefix_lens: Optional[torch.Tensor], kv_start_idx: torch.Tensor, kv_indptr: torch.Tensor, qo_indptr: torch.Tensor, use_ragged: bool, spec_info: Optional[SpecInput], use_sliding_window_kv_pool: bool=False, fixed_split_size: Optional[int]=None, multi_item_params: Optional[MultiItemScoringParams]=None, cross_attention_custom_mask: Optional[torch.Tensor]=None, seq_lens_cpu: Optional[torch.Tensor]=None)|ae8f911c6811890d',
        },
        'sglang.srt.speculative.dflash_worker_v2': {
            'DFlashWorkerV2.forward_batch_generation':
                '(self, batch: ScheduleBatch, on_publish=None)|7768beb45cc88eda',
        },
        'sglang.srt.speculative.dflash_info_v2': {
            'DFlashDraftInputV2.prepare_for_decode':
                '(self, batch: ScheduleBatch)|75b4c505f39a994c',
        },
        'sglang.srt.mem_cache.allocation_sizing': {
            'page_aligned_decode_alloc_lens':
                'absent',
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
        'sglang.srt.layers.attention.flashinfer_backend': {
            'fast_prefill_plan':
                "(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor, paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int, head_dim_vo: Optional[int]=None, custom_mask: Optional[torch.Tensor]=None, causal: bool=False, window_left: int=-1, q_data_type: Union[str, torch.dtype]='float16', kv_data_type: Optional[Union[str, torch.dtype]]=None, o_data_type: Optional[Union[str, torch.dtype]]=None, non_blocking: bool=True, fixed_split_size: Optional[int]=None, prefix_len_ptr: Optional[torch.Tensor]=None, token_pos_in_items_ptr: Optional[torch.Tensor]=None, token_pos_in_items_len: int=0, max_item_len_ptr: Optional[torch.Tensor]=None, *, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor, kv_lens_host: torch.Tensor, max_q_len: int, max_kv_len: int)|d7393acf5a116aa3",
            'FlashInferAttnBackend.init_forward_metadata_out_graph':
                '(self, forward_batch: ForwardBatch, in_capture: bool=False)|b317d0036214c00a',
            'FlashInferIndicesUpdaterPrefill.call_begin_forward':
                '(self, wrapper_ragged: BatchPrefillWithRaggedKVCacheWrapper, wrapper_paged: BatchPrefillWithPagedKVCacheWrapper, req_pool_indices: torch.Tensor, paged_kernel_lens: torch.Tensor, paged_kernel_lens_sum: int, seq_lens: torch.Tensor, prefix_lens: Optional[torch.Tensor], kv_start_idx: torch.Tensor, kv_indptr: torch.Tensor, qo_indptr: torch.Tensor, use_ragged: bool, spec_info: Optional[SpecInput], use_sliding_window_kv_pool: bool=False, fixed_split_size: Optional[int]=None, multi_item_params: Optional[MultiItemScoringParams]=None, cross_attention_custom_mask: Optional[torch.Tensor]=None, seq_lens_cpu: Optional[torch.Tensor]=None)|ae8f911c6811890d',
        },
        'sglang.srt.speculative.dflash_worker_v2': {
            'DFlashWorkerV2.forward_batch_generation':
                '(self, batch: ScheduleBatch, on_publish=None)|7768beb45cc88eda',
        },
        'sglang.srt.speculative.dflash_info_v2': {
            'DFlashDraftInputV2.prepare_for_decode':
                '(self, batch: ScheduleBatch)|75b4c505f39a994c',
        },
        'sglang.srt.mem_cache.allocation_sizing': {
            'page_aligned_decode_alloc_lens':
                'absent',
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
        'sglang.srt.layers.attention.flashinfer_backend': {
            'fast_prefill_plan':
                "(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor, paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int, head_dim_vo: Optional[int]=None, custom_mask: Optional[torch.Tensor]=None, causal: bool=False, window_left: int=-1, q_data_type: Union[str, torch.dtype]='float16', kv_data_type: Optional[Union[str, torch.dtype]]=None, o_data_type: Optional[Union[str, torch.dtype]]=None, non_blocking: bool=True, fixed_split_size: Optional[int]=None, prefix_len_ptr: Optional[torch.Tensor]=None, token_pos_in_items_ptr: Optional[torch.Tensor]=None, token_pos_in_items_len: int=0, max_item_len_ptr: Optional[torch.Tensor]=None, *, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor, kv_lens_host: torch.Tensor, max_q_len: int, max_kv_len: int)|d7393acf5a116aa3",
            'FlashInferAttnBackend.init_forward_metadata_out_graph':
                '(self, forward_batch: ForwardBatch, in_capture: bool=False)|a499b347f0706f8c',
            'FlashInferIndicesUpdaterPrefill.call_begin_forward':
                '(self, wrapper_ragged: BatchPrefillWithRaggedKVCacheWrapper, wrapper_paged: BatchPrefillWithPagedKVCacheWrapper, req_pool_indices: torch.Tensor, paged_kernel_lens: torch.Tensor, paged_kernel_lens_sum: int, seq_lens: torch.Tensor, prefix_lens: Optional[torch.Tensor], kv_start_idx: torch.Tensor, kv_indptr: torch.Tensor, qo_indptr: torch.Tensor, use_ragged: bool, spec_info: Optional[SpecInput], use_sliding_window_kv_pool: bool=False, fixed_split_size: Optional[int]=None, multi_item_params: Optional[MultiItemScoringParams]=None, cross_attention_custom_mask: Optional[torch.Tensor]=None, seq_lens_cpu: Optional[torch.Tensor]=None, custom_kv_indices: Optional[torch.Tensor]=None, window_left: int=-1)|98f9525d08b88665',
        },
        'sglang.srt.speculative.dflash_worker_v2': {
            'DFlashWorkerV2.forward_batch_generation':
                '(self, batch: ScheduleBatch, on_publish=None)|5d17f8abfdb4a9d5',
        },
        'sglang.srt.speculative.dflash_info_v2': {
            'DFlashDraftInputV2.prepare_for_decode':
                '(self, batch: ScheduleBatch)|104b0138f11531a6',
        },
        'sglang.srt.mem_cache.allocation_sizing': {
            'page_aligned_decode_alloc_lens':
                'absent',
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
        'sglang.srt.layers.attention.flashinfer_backend': {
            'fast_prefill_plan':
                "(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor, paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int, head_dim_vo: Optional[int]=None, custom_mask: Optional[torch.Tensor]=None, causal: bool=False, window_left: int=-1, q_data_type: Union[str, torch.dtype]='float16', kv_data_type: Optional[Union[str, torch.dtype]]=None, o_data_type: Optional[Union[str, torch.dtype]]=None, non_blocking: bool=True, fixed_split_size: Optional[int]=None, prefix_len_ptr: Optional[torch.Tensor]=None, token_pos_in_items_ptr: Optional[torch.Tensor]=None, token_pos_in_items_len: int=0, max_item_len_ptr: Optional[torch.Tensor]=None, *, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor, kv_lens_host: torch.Tensor, max_q_len: int, max_kv_len: int)|d7393acf5a116aa3",
            'FlashInferAttnBackend.init_forward_metadata_out_graph':
                '(self, forward_batch: ForwardBatch, in_capture: bool=False)|a499b347f0706f8c',
            'FlashInferIndicesUpdaterPrefill.call_begin_forward':
                '(self, wrapper_ragged: BatchPrefillWithRaggedKVCacheWrapper, wrapper_paged: BatchPrefillWithPagedKVCacheWrapper, req_pool_indices: torch.Tensor, paged_kernel_lens: torch.Tensor, paged_kernel_lens_sum: int, seq_lens: torch.Tensor, prefix_lens: Optional[torch.Tensor], kv_start_idx: torch.Tensor, kv_indptr: torch.Tensor, qo_indptr: torch.Tensor, use_ragged: bool, spec_info: Optional[SpecInput], use_sliding_window_kv_pool: bool=False, fixed_split_size: Optional[int]=None, multi_item_params: Optional[MultiItemScoringParams]=None, cross_attention_custom_mask: Optional[torch.Tensor]=None, seq_lens_cpu: Optional[torch.Tensor]=None, custom_kv_indices: Optional[torch.Tensor]=None, window_left: int=-1)|98f9525d08b88665',
        },
        'sglang.srt.speculative.dflash_worker_v2': {
            'DFlashWorkerV2.forward_batch_generation':
                '(self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None)|ff68541ebf0c386b',
        },
        'sglang.srt.speculative.dflash_info_v2': {
            'DFlashDraftInputV2.prepare_for_decode':
                '(self, batch: ScheduleBatch)|8b08173d61b36ff7',
        },
        'sglang.srt.mem_cache.allocation_sizing': {
            'page_aligned_decode_alloc_lens':
                'absent',
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
        'sglang.srt.layers.attention.flashinfer_backend': {
            'fast_prefill_plan':
                "(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor, paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int, head_dim_vo: Optional[int]=None, custom_mask: Optional[torch.Tensor]=None, causal: bool=False, window_left: int=-1, q_data_type: Union[str, torch.dtype]='float16', kv_data_type: Optional[Union[str, torch.dtype]]=None, o_data_type: Optional[Union[str, torch.dtype]]=None, non_blocking: bool=True, fixed_split_size: Optional[int]=None, prefix_len_ptr: Optional[torch.Tensor]=None, token_pos_in_items_ptr: Optional[torch.Tensor]=None, token_pos_in_items_len: int=0, max_item_len_ptr: Optional[torch.Tensor]=None, *, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor, kv_lens_host: torch.Tensor, max_q_len: int, max_kv_len: int)|e1915e689fdd072c",
            'FlashInferAttnBackend.init_forward_metadata_out_graph':
                '(self, forward_batch: ForwardBatch, in_capture: bool=False)|a499b347f0706f8c',
            'FlashInferIndicesUpdaterPrefill.call_begin_forward':
                '(self, wrapper_ragged: BatchPrefillWithRaggedKVCacheWrapper, wrapper_paged: BatchPrefillWithPagedKVCacheWrapper, req_pool_indices: torch.Tensor, paged_kernel_lens: torch.Tensor, paged_kernel_lens_sum: int, seq_lens: torch.Tensor, prefix_lens: Optional[torch.Tensor], kv_start_idx: torch.Tensor, kv_indptr: torch.Tensor, qo_indptr: torch.Tensor, use_ragged: bool, spec_info: Optional[SpecInput], use_sliding_window_kv_pool: bool=False, fixed_split_size: Optional[int]=None, multi_item_params: Optional[MultiItemScoringParams]=None, cross_attention_custom_mask: Optional[torch.Tensor]=None, seq_lens_cpu: Optional[torch.Tensor]=None, custom_kv_indices: Optional[torch.Tensor]=None, window_left: int=-1)|98f9525d08b88665',
        },
        'sglang.srt.speculative.dflash_worker_v2': {
            'DFlashWorkerV2.forward_batch_generation':
                '(self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None)|9fd6fb2a0f01b2d5',
        },
        'sglang.srt.speculative.dflash_info_v2': {
            'DFlashDraftInputV2.prepare_for_decode':
                '(self, batch: ScheduleBatch)|c61566270c1e36db',
        },
        'sglang.srt.mem_cache.allocation_sizing': {
            'page_aligned_decode_alloc_lens':
                'absent',
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
        'sglang.srt.layers.attention.flashinfer_backend': {
            'fast_prefill_plan':
                "(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor, paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int, head_dim_vo: Optional[int]=None, custom_mask: Optional[torch.Tensor]=None, causal: bool=False, window_left: int=-1, q_data_type: Union[str, torch.dtype]='float16', kv_data_type: Optional[Union[str, torch.dtype]]=None, o_data_type: Optional[Union[str, torch.dtype]]=None, non_blocking: bool=True, fixed_split_size: Optional[int]=None, prefix_len_ptr: Optional[torch.Tensor]=None, token_pos_in_items_ptr: Optional[torch.Tensor]=None, token_pos_in_items_len: int=0, max_item_len_ptr: Optional[torch.Tensor]=None, *, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor, kv_lens_host: torch.Tensor, max_q_len: int, max_kv_len: int)|e1915e689fdd072c",
            'FlashInferAttnBackend.init_forward_metadata_out_graph':
                '(self, forward_batch: ForwardBatch, in_capture: bool=False)|98a644ea6953e7fa',
            'FlashInferIndicesUpdaterPrefill.call_begin_forward':
                '(self, wrapper_ragged: BatchPrefillWithRaggedKVCacheWrapper, wrapper_paged: BatchPrefillWithPagedKVCacheWrapper, req_pool_indices: torch.Tensor, paged_kernel_lens: torch.Tensor, paged_kernel_lens_sum: int, seq_lens: torch.Tensor, prefix_lens: Optional[torch.Tensor], kv_start_idx: torch.Tensor, kv_indptr: torch.Tensor, qo_indptr: torch.Tensor, use_ragged: bool, spec_info: Optional[SpecInput], use_sliding_window_kv_pool: bool=False, fixed_split_size: Optional[int]=None, multi_item_params: Optional[MultiItemScoringParams]=None, cross_attention_custom_mask: Optional[torch.Tensor]=None, seq_lens_cpu: Optional[torch.Tensor]=None, custom_kv_indices: Optional[torch.Tensor]=None, window_left: int=-1, *, kv_view: KVIndexTable)|9eb76ec08aeea1b7',
        },
        'sglang.srt.speculative.dflash_worker_v2': {
            'DFlashWorkerV2.forward_batch_generation':
                '(self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None)|1a04b7f85d4e27e4',
        },
        'sglang.srt.speculative.dflash_info_v2': {
            'DFlashDraftInputV2.prepare_for_decode':
                '(self, batch: ScheduleBatch)|4d42a3fedc7f9bdd',
        },
        'sglang.srt.mem_cache.allocation_sizing': {
            'page_aligned_decode_alloc_lens':
                '(reqs, *, reserve: int, page_size: int)|a0d000683d01b479',
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
        'sglang.srt.layers.attention.flashinfer_backend': {
            'fast_prefill_plan':
                "(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor, paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int, head_dim_vo: Optional[int]=None, custom_mask: Optional[torch.Tensor]=None, causal: bool=False, window_left: int=-1, q_data_type: Union[str, torch.dtype]='float16', kv_data_type: Optional[Union[str, torch.dtype]]=None, o_data_type: Optional[Union[str, torch.dtype]]=None, non_blocking: bool=True, fixed_split_size: Optional[int]=None, prefix_len_ptr: Optional[torch.Tensor]=None, token_pos_in_items_ptr: Optional[torch.Tensor]=None, token_pos_in_items_len: int=0, max_item_len_ptr: Optional[torch.Tensor]=None, *, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor, kv_lens_host: torch.Tensor, max_q_len: int, max_kv_len: int)|e1915e689fdd072c",
            'FlashInferAttnBackend.init_forward_metadata_out_graph':
                '(self, forward_batch: ForwardBatch, in_capture: bool=False)|94049cb11ddf9d4f',
            'FlashInferIndicesUpdaterPrefill.call_begin_forward':
                '(self, wrapper_ragged: BatchPrefillWithRaggedKVCacheWrapper, wrapper_paged: BatchPrefillWithPagedKVCacheWrapper, req_pool_indices: torch.Tensor, paged_kernel_lens: torch.Tensor, paged_kernel_lens_sum: int, seq_lens: torch.Tensor, prefix_lens: Optional[torch.Tensor], kv_start_idx: torch.Tensor, kv_indptr: torch.Tensor, qo_indptr: torch.Tensor, use_ragged: bool, spec_info: Optional[SpecInput], use_sliding_window_kv_pool: bool=False, fixed_split_size: Optional[int]=None, multi_item_params: Optional[MultiItemScoringParams]=None, cross_attention_custom_mask: Optional[torch.Tensor]=None, seq_lens_cpu: Optional[torch.Tensor]=None, custom_kv_indices: Optional[torch.Tensor]=None, window_left: int=-1)|0ba489d5ba9b0c01',
        },
        'sglang.srt.speculative.dflash_worker_v2': {
            'DFlashWorkerV2.forward_batch_generation':
                '(self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None)|c7914d6c5f86976a',
        },
        'sglang.srt.speculative.dflash_info_v2': {
            'DFlashDraftInputV2.prepare_for_decode':
                '(self, batch: ScheduleBatch)|4d42a3fedc7f9bdd',
        },
        'sglang.srt.mem_cache.allocation_sizing': {
            'page_aligned_decode_alloc_lens':
                '(reqs, *, reserve: int, page_size: int)|a0d000683d01b479',
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
        'sglang.srt.layers.attention.flashinfer_backend': {
            'fast_prefill_plan':
                "(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor, paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int, head_dim_vo: Optional[int]=None, custom_mask: Optional[torch.Tensor]=None, causal: bool=False, window_left: int=-1, q_data_type: Union[str, torch.dtype]='float16', kv_data_type: Optional[Union[str, torch.dtype]]=None, o_data_type: Optional[Union[str, torch.dtype]]=None, non_blocking: bool=True, fixed_split_size: Optional[int]=None, prefix_len_ptr: Optional[torch.Tensor]=None, token_pos_in_items_ptr: Optional[torch.Tensor]=None, token_pos_in_items_len: int=0, max_item_len_ptr: Optional[torch.Tensor]=None, *, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor, kv_lens_host: torch.Tensor, max_q_len: int, max_kv_len: int)|e1915e689fdd072c",
            'FlashInferAttnBackend.init_forward_metadata_out_graph':
                '(self, forward_batch: ForwardBatch, in_capture: bool=False)|94049cb11ddf9d4f',
            'FlashInferIndicesUpdaterPrefill.call_begin_forward':
                '(self, wrapper_ragged: BatchPrefillWithRaggedKVCacheWrapper, wrapper_paged: BatchPrefillWithPagedKVCacheWrapper, req_pool_indices: torch.Tensor, paged_kernel_lens: torch.Tensor, paged_kernel_lens_sum: int, seq_lens: torch.Tensor, prefix_lens: Optional[torch.Tensor], kv_start_idx: torch.Tensor, kv_indptr: torch.Tensor, qo_indptr: torch.Tensor, use_ragged: bool, spec_info: Optional[SpecInput], use_sliding_window_kv_pool: bool=False, fixed_split_size: Optional[int]=None, multi_item_params: Optional[MultiItemScoringParams]=None, cross_attention_custom_mask: Optional[torch.Tensor]=None, seq_lens_cpu: Optional[torch.Tensor]=None, custom_kv_indices: Optional[torch.Tensor]=None, window_left: int=-1)|0ba489d5ba9b0c01',
        },
        'sglang.srt.speculative.dflash_worker_v2': {
            'DFlashWorkerV2.forward_batch_generation':
                '(self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None)|bc7d441c23e4e08d',
        },
        'sglang.srt.speculative.dflash_info_v2': {
            'DFlashDraftInputV2.prepare_for_decode':
                '(self, batch: ScheduleBatch)|4d42a3fedc7f9bdd',
        },
        'sglang.srt.mem_cache.allocation_sizing': {
            'page_aligned_decode_alloc_lens':
                '(reqs, *, reserve: int, page_size: int)|a0d000683d01b479',
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
        'sglang.srt.layers.attention.flashinfer_backend': {
            'fast_prefill_plan':
                "(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor, paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int, head_dim_vo: Optional[int]=None, custom_mask: Optional[torch.Tensor]=None, causal: bool=False, window_left: int=-1, q_data_type: Union[str, torch.dtype]='float16', kv_data_type: Optional[Union[str, torch.dtype]]=None, o_data_type: Optional[Union[str, torch.dtype]]=None, non_blocking: bool=True, fixed_split_size: Optional[int]=None, prefix_len_ptr: Optional[torch.Tensor]=None, token_pos_in_items_ptr: Optional[torch.Tensor]=None, token_pos_in_items_len: int=0, max_item_len_ptr: Optional[torch.Tensor]=None, *, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor, kv_lens_host: torch.Tensor, max_q_len: int, max_kv_len: int)|e1915e689fdd072c",
            'FlashInferAttnBackend.init_forward_metadata_out_graph':
                '(self, forward_batch: ForwardBatch, in_capture: bool=False)|43ab0402a3346920',
            'FlashInferIndicesUpdaterPrefill.call_begin_forward':
                '(self, wrapper_ragged: BatchPrefillWithRaggedKVCacheWrapper, wrapper_paged: BatchPrefillWithPagedKVCacheWrapper, req_pool_indices: torch.Tensor, paged_kernel_lens: torch.Tensor, paged_kernel_lens_sum: int, seq_lens: torch.Tensor, prefix_lens: Optional[torch.Tensor], kv_start_idx: torch.Tensor, kv_indptr: torch.Tensor, qo_indptr: torch.Tensor, use_ragged: bool, spec_info: Optional[SpecInput], use_sliding_window_kv_pool: bool=False, fixed_split_size: Optional[int]=None, multi_item_params: Optional[MultiItemScoringParams]=None, cross_attention_custom_mask: Optional[torch.Tensor]=None, seq_lens_cpu: Optional[torch.Tensor]=None, custom_kv_indices: Optional[torch.Tensor]=None, window_left: int=-1, *, plan: KVLocPlan)|164065c7b1b537cd',
        },
        'sglang.srt.speculative.dflash_worker_v2': {
            'DFlashWorkerV2.forward_batch_generation':
                '(self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None)|31473cb858125c78',
        },
        'sglang.srt.speculative.dflash_info_v2': {
            'DFlashDraftInputV2.prepare_for_decode':
                '(self, batch: ScheduleBatch)|4d42a3fedc7f9bdd',
        },
        'sglang.srt.mem_cache.allocation_sizing': {
            'page_aligned_decode_alloc_lens':
                '(reqs, *, reserve: int, page_size: int)|a0d000683d01b479',
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
        'sglang.srt.layers.attention.flashinfer_backend': {
            'fast_prefill_plan':
                "(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor, paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int, head_dim_vo: Optional[int]=None, custom_mask: Optional[torch.Tensor]=None, causal: bool=False, window_left: int=-1, q_data_type: Union[str, torch.dtype]='float16', kv_data_type: Optional[Union[str, torch.dtype]]=None, o_data_type: Optional[Union[str, torch.dtype]]=None, non_blocking: bool=True, fixed_split_size: Optional[int]=None, prefix_len_ptr: Optional[torch.Tensor]=None, token_pos_in_items_ptr: Optional[torch.Tensor]=None, token_pos_in_items_len: int=0, max_item_len_ptr: Optional[torch.Tensor]=None, *, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor, kv_lens_host: torch.Tensor, max_q_len: int, max_kv_len: int, uniform_verify_width: Optional[int]=None)|f98b623c486b6d9b",
            'FlashInferAttnBackend.init_forward_metadata_out_graph':
                '(self, forward_batch: ForwardBatch, in_capture: bool=False)|83d290d127a28920',
            'FlashInferIndicesUpdaterPrefill.call_begin_forward':
                '(self, wrapper_ragged: BatchPrefillWithRaggedKVCacheWrapper, wrapper_paged: BatchPrefillWithPagedKVCacheWrapper, req_pool_indices: torch.Tensor, paged_kernel_lens: torch.Tensor, paged_kernel_lens_sum: int, seq_lens: torch.Tensor, prefix_lens: Optional[torch.Tensor], kv_start_idx: torch.Tensor, kv_indptr: torch.Tensor, qo_indptr: torch.Tensor, use_ragged: bool, spec_info: Optional[SpecInput], use_sliding_window_kv_pool: bool=False, fixed_split_size: Optional[int]=None, multi_item_params: Optional[MultiItemScoringParams]=None, cross_attention_custom_mask: Optional[torch.Tensor]=None, seq_lens_cpu: Optional[torch.Tensor]=None, custom_kv_indices: Optional[torch.Tensor]=None, window_left: int=-1, *, plan: KVLocPlan)|36e49de36b6727f8',
        },
        'sglang.srt.speculative.dflash_worker_v2': {
            'DFlashWorkerV2.forward_batch_generation':
                '(self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None)|671b5faccf7da0ed',
        },
        'sglang.srt.speculative.dflash_info_v2': {
            'DFlashDraftInputV2.prepare_for_decode':
                '(self, batch: ScheduleBatch)|4d42a3fedc7f9bdd',
        },
        'sglang.srt.mem_cache.allocation_sizing': {
            'page_aligned_decode_alloc_lens':
                '(reqs, *, reserve: int, page_size: int)|a0d000683d01b479',
        },
    },
}
