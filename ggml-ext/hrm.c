#include "hrm.h"

#include <string.h>

// IEEE half bit patterns of the two values a mask holds.
#define HRM_F16_ZERO    ((uint16_t) 0x0000)
#define HRM_F16_NEG_INF ((uint16_t) 0xFC00)

int hrm_ggml_qnt_version(void) {
    return GGML_QNT_VERSION;
}

int hrm_virtual_layer(int h, int l, int layer, int l_cycles, int layers_per_stack) {
    return (h * (l_cycles + 1) + l) * layers_per_stack + layer;
}

int hrm_fill_mask(uint16_t * mask, int n_q, int n_kv, int n_kv_pad,
                  const int32_t * q_pos, const int32_t * token_types) {
    if (mask == NULL || q_pos == NULL || n_q < 0 || n_kv < 0 || n_kv_pad < n_kv) {
        return -1;
    }
    for (int i = 0; i < n_q; ++i) {
        if (q_pos[i] < 0 || q_pos[i] >= n_kv) {
            return -1;
        }
    }
    for (int i = 0; i < n_q; ++i) {
        uint16_t * row = mask + (size_t) i * n_kv_pad;
        const int p = q_pos[i];
        const int q_in_prefix = token_types != NULL && token_types[p] == 1;
        for (int j = 0; j < n_kv; ++j) {
            const int visible = j <= p || (q_in_prefix && token_types[j] == 1);
            row[j] = visible ? HRM_F16_ZERO : HRM_F16_NEG_INF;
        }
        for (int j = n_kv; j < n_kv_pad; ++j) {
            row[j] = HRM_F16_NEG_INF;
        }
    }
    return 0;
}
