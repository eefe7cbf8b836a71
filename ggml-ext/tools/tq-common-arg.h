// tq-common-arg.h - turboquant's command-line options for llama.cpp's common argument parser
// (common/arg.cpp adds them to every tool's options with one call). The values land in
// common_params and from there in llama_context_params (tq-llama-options.h).
#pragma once

#include "arg.h"
#include "common.h"
#include "tq-llama-options.h"

#include <vector>

static inline std::vector<common_arg> tq_common_args() {
    std::vector<common_arg> v;
    v.push_back(common_arg(
        {"--tq-k-mean"}, "on|off",
        "turbo K cache: store each key minus a per-layer mean (softmax-invariant; changes the saved-state format)\n"
        "(default: on)",
        [](common_params & params, const std::string & value) {
            params.tq_k_mean = tq_llama_switch_arg("--tq-k-mean", value);
        }
    ).set_env("TQ_K_MEAN"));
    v.push_back(common_arg(
        {"--tq-k-balance"}, "on|off",
        "turbo K cache: K/Q channel balancing, with --tq-k-mean (logit-exact; changes the saved-state format)\n"
        "(default: on)",
        [](common_params & params, const std::string & value) {
            params.tq_k_balance = tq_llama_switch_arg("--tq-k-balance", value);
        }
    ).set_env("TQ_K_BALANCE"));
    return v;
}
