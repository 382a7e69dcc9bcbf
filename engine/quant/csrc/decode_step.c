void kv_decode_step(void) {}
