set -x
P="python3 scripts/probes/gemm_configs.py --reps 20"
$P --shape 777x3001x2000:float32 --shape 2047x2049x1023:float32 --shape 1536x1536x1536:float32 --config default \
  --config simt:tile_m=128,tile_n=128,tile_k=32,num_stages=2,threads_m=16,threads_n=16,a_smem_major=k \
  --config simt:tile_m=128,tile_n=64,tile_k=8,num_stages=4,threads_m=16,threads_n=8,a_smem_major=k \
  --config simt:tile_m=64,tile_n=128,tile_k=16,num_stages=4,threads_m=8,threads_n=16,a_smem_major=k \
  --config simt:a_smem_major=k,tile_k=16 \
  --config simt:tile_m=64,tile_n=64,tile_k=16,num_stages=3,threads_m=16,threads_n=16,a_smem_major=k \
  --config simt:a_smem_major=k --config simt:split_k=2 > $OUT/sgemm_probe.txt 2>&1
$P --shape 12x1000x999:float16 --shape 12x1000x999:bfloat16 --config default --config sm80:split_k=4 --config sm80:split_k=8 \
  --config sm80:tile_n=64,split_k=4 --config sm80:tile_n=64,split_k=8 --config sm80:split_k=1 > $OUT/hgemm_probe.txt 2>&1
timeout 150 python3 scripts/probes/first_call_profile.py scan attention conv3d > $OUT/first_call_profile.txt 2>&1
tail -3 $OUT/*.txt
