// forty-first session: the AVX2 tile's integer loop alone (R rows, 16 columns, all in L1, no float epilogue): cycles per
// (row, block) at 3.66 GHz. gcc -O3 -mavx2 -mfma; for R in 1 2 3 4 6 8: sed the define and run.
#include <stdio.h>
#include <time.h>
#include <stdint.h>
#include <immintrin.h>
static double now(){struct timespec a;clock_gettime(CLOCK_MONOTONIC,&a);return a.tv_sec+a.tv_nsec*1e-9;}
#define R 4
uint8_t W[4096] __attribute__((aligned(64))); int8_t X[R][4096] __attribute__((aligned(64)));
int main(){ for(int i=0;i<4096;i++){W[i]=i*7;for(int r=0;r<R;r++)X[r][i]=i*3+r;}
 const __m256i low=_mm256_set1_epi8(15); __m256i acc[R][2]; for(int r=0;r<R;r++)acc[r][0]=acc[r][1]=_mm256_setzero_si256();
 long n=20000000; double t=now();
 for(long it=0;it<n;it++){ int o=(it&15)*64; 
  for(int i=0;i<4;i++){ __m256i p0=_mm256_load_si256((__m256i*)(W+o+64*i)),p1=_mm256_load_si256((__m256i*)(W+o+64*i+32));
   __m256i l0=_mm256_and_si256(p0,low),h0=_mm256_and_si256(_mm256_srli_epi16(p0,4),low),l1=_mm256_and_si256(p1,low),h1=_mm256_and_si256(_mm256_srli_epi16(p1,4),low);
   for(int r=0;r<R;r++){ const int32_t* q=(const int32_t*)(X[r]+o/2+8*i); __m256i xl=_mm256_set1_epi32(q[0]),xh=_mm256_set1_epi32(q[1]);
    acc[r][0]=_mm256_add_epi16(acc[r][0],_mm256_add_epi16(_mm256_maddubs_epi16(l0,xl),_mm256_maddubs_epi16(h0,xh)));
    acc[r][1]=_mm256_add_epi16(acc[r][1],_mm256_add_epi16(_mm256_maddubs_epi16(l1,xl),_mm256_maddubs_epi16(h1,xh))); } } }
 double s=now()-t; __m256i z=_mm256_setzero_si256(); for(int r=0;r<R;r++)z=_mm256_add_epi16(z,_mm256_add_epi16(acc[r][0],acc[r][1]));
 int16_t out[16]; _mm256_storeu_si256((__m256i*)out,z);
 printf("R=%d: %.2f cycles per row-block (16 maddubs each; floor 8)  [%d]\n",R,s*3.66e9/n/R,out[0]); return 0;}
