/* tq_fa_terms.h - what tq_fa_terms.comp and its dispatch (tq-vulkan.h) share: the query heads
   one invocation computes, so that each cell's row of T is read once for that many dots. */
#ifndef TQ_FA_TERMS_H
#define TQ_FA_TERMS_H
#define TQ_FA_TERMS_HEADS 8u
#endif
